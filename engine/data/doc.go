// Package data turns JSONL datasets into packed, shuffled, resumable micro-batches of token ids.
//
// It reads four record shapes, one JSON object per line:
//
//	{"text": "..."}                                    pretraining: every token is a target
//	{"messages": [{"role": "...", "content": "..."}]}  chat SFT: only assistant tokens are targets
//	{"prompt": "...", "completion": "..."}             the completion is the target
//	{"input_ids": [17, 5, ...]}                        pre-tokenized: every token is a target
//
// Preference datasets (TRL's formats) are read apart, by ReadPreferenceFiles: paired rows
// {"prompt", "chosen", "rejected"} and unpaired rows {"prompt", "completion", "label"}, each
// field plain text or a list of messages (conversational paired rows may leave the prompt
// out: the messages chosen and rejected share are the prompt). Bad rows are not fatal: they
// are returned with their line numbers and reasons (BadRow, SummarizeBadRows) and left out.
//
// Records become Documents (token ids plus a per-token train mask) through an Encoder supplied
// by the caller, run on all cores. Documents are packed into micro-batches of at most a fixed
// token budget by best-fit decreasing; positions restart at 0 for every document and each
// document's boundaries travel with the batch, so attention never crosses them. A Document
// may hold several segments (a preference pair's two sequences), which the batch keeps as
// separate sequences but never splits across micro-batches; Batch.Sources and Batch.Segs
// say where each sequence came from. A Loader walks
// the packed micro-batches epoch after epoch in an order fixed by (seed, epoch); its Cursor
// (epoch, index) is all that is needed to resume exactly.
//
// The package is not a tokenizer and knows nothing about chat templates or models: the caller
// maps records to token ids (see Encoder), and checks pre-tokenized ids against its vocabulary. It holds whole datasets in memory; streaming
// datasets larger than memory is not supported.
package data
