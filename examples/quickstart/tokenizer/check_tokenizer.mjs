// Loads tokenizer.json with Hugging Face tokenizers (npm package "tokenizers") and prints the
// encoding of a ChatML arithmetic chat, so it can be compared with the Go tokenizer.
// Usage: node check_tokenizer.mjs [TEXT]   (run `npm install tokenizers` first)
import { Tokenizer } from "tokenizers";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const dir = dirname(fileURLToPath(import.meta.url));
const tok = Tokenizer.fromFile(join(dir, "tokenizer.json"));
const text = process.argv[2] ??
  "<|im_start|>user\nWhat is 37+48?<|im_end|>\n<|im_start|>assistant\n85<|im_end|>\n";
const enc = await tok.encode(text, null, { addSpecialTokens: false });
const ids = enc.getIds();
const back = await tok.decode(ids, false);
if (back !== text) {
  console.error("round trip changed the text:", JSON.stringify(back));
  process.exit(1);
}
console.log(JSON.stringify({ vocab_size: tok.getVocabSize(true), ids, tokens: enc.getTokens() }));
