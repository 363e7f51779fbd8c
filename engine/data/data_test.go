package data

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestReadFormats(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		format Format
		want   []Record
	}{
		{"text", `{"text":"hello"}` + "\n\n" + `{"text":"x","id":3}`, FormatText, []Record{
			{Source: "f", Line: 1, Kind: FormatText, Text: "hello"},
			{Source: "f", Line: 3, Kind: FormatText, Text: "x"},
		}},
		{"auto detects each line", `{"text":"a"}` + "\n" + `{"prompt":"p","completion":"c"}` + "\n" +
			`{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}`, FormatAuto, []Record{
			{Source: "f", Line: 1, Kind: FormatText, Text: "a"},
			{Source: "f", Line: 2, Kind: FormatPromptCompletion, Prompt: "p", Completion: "c"},
			{Source: "f", Line: 3, Kind: FormatMessages, Messages: []Message{{"user", "q"}, {"assistant", "a"}}},
		}},
		{"no trailing newline, CRLF", "{\"text\":\"a\"}\r\n{\"text\":\"b\"}", FormatText, []Record{
			{Source: "f", Line: 1, Kind: FormatText, Text: "a"},
			{Source: "f", Line: 2, Kind: FormatText, Text: "b"},
		}},
		{"tokens", `{"input_ids":[5,0,2147483647]}` + "\n" + `{"input_ids":[1, 2],"text_note":"x"}`, FormatTokens, []Record{
			{Source: "f", Line: 1, Kind: FormatTokens, IDs: []int32{5, 0, 2147483647}},
			{Source: "f", Line: 2, Kind: FormatTokens, IDs: []int32{1, 2}},
		}},
		{"auto detects tokens", `{"input_ids":[7,8]}`, FormatAuto, []Record{
			{Source: "f", Line: 1, Kind: FormatTokens, IDs: []int32{7, 8}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Read(strings.NewReader(tc.in), "f", tc.format)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReadErrorsNameFileAndLine(t *testing.T) {
	tests := []struct {
		name, in string
		format   Format
		want     string
	}{
		{"bad json", "{\"text\":\"a\"}\n{\"text\":", FormatAuto, "d.jsonl:2: invalid JSON"},
		{"not an object", "[1,2]", FormatAuto, "d.jsonl:1: expected a JSON object"},
		{"wrong type", `{"text": 5}`, FormatText, `d.jsonl:1: key "text": expected string`},
		{"missing key", `{"prompt":"p","completion":"c"}`, FormatText, `d.jsonl:1: format is text but the record has no "text" key`},
		{"no known key", `{"foo":1}`, FormatAuto, `d.jsonl:1: record has none of the keys`},
		{"no assistant", `{"messages":[{"role":"user","content":"q"}]}`, FormatMessages, `d.jsonl:1: no "assistant" message`},
		{"message without role", `{"messages":[{"content":"q"}]}`, FormatMessages, `d.jsonl:1: messages[0] has no "role"`},
		{"non-string content", `{"messages":[{"role":"user","content":[1]}]}`, FormatMessages, `d.jsonl:1: messages[0]: role and content must be strings`},
		{"empty completion", `{"prompt":"p","completion":""}`, FormatAuto, `d.jsonl:1: "completion" is empty`},
		{"empty file", "\n\n", FormatAuto, `d.jsonl: no records`},
		{"tokens without ids", `{"text":"a"}`, FormatTokens, `d.jsonl:1: format is tokens but the record has no "input_ids" key`},
		{"ids not a list", `{"input_ids":"1 2"}`, FormatTokens, `d.jsonl:1: "input_ids" must be a list of integer token ids`},
		{"negative id", `{"input_ids":[1,-2]}`, FormatTokens, `d.jsonl:1: "input_ids" item 1 (-2) is not a token id`},
		{"fractional id", "\n" + `{"input_ids":[1,2.5]}`, FormatTokens, `d.jsonl:2: "input_ids" item 1 (2.5) is not a token id`},
		{"id beyond int32", `{"input_ids":[2147483648,1]}`, FormatAuto, `d.jsonl:1: "input_ids" item 0 (2147483648) is not a token id`},
		{"one id", `{"input_ids":[3]}`, FormatTokens, `d.jsonl:1: "input_ids" has 1 ids: need at least 2`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tc.in), "d.jsonl", tc.format)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := ParseFormat("chat"); err == nil || !strings.Contains(err.Error(), "messages") {
		t.Fatalf("ParseFormat(chat) = %v, want an error listing the formats", err)
	}
}

func FuzzRead(f *testing.F) {
	f.Add(`{"text":"hello"}`)
	f.Add(`{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}`)
	f.Add(`{"prompt":"p","completion":"c"}` + "\n" + `{"text":1}`)
	f.Add("{\"text\":\"\\u00e9\"}\n\n\r\n")
	f.Add(`{"input_ids":[1,2,3]}` + "\n" + `{"input_ids":[1e3,-0]}`)
	f.Fuzz(func(t *testing.T, in string) {
		recs, err := Read(strings.NewReader(in), "fuzz", FormatAuto)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "data: fuzz") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, r := range recs {
			if r.Line < 1 || r.Kind == FormatAuto {
				t.Fatalf("bad record %+v", r)
			}
			if r.Kind == FormatTokens && len(r.IDs) < 2 {
				t.Fatalf("tokens record with %d ids: %+v", len(r.IDs), r)
			}
			for _, id := range r.IDs {
				if id < 0 {
					t.Fatalf("negative token id in %+v", r)
				}
			}
		}
	})
}

func charDoc(n int, trainFrom int) Document {
	d := Document{Tokens: make([]int32, n), Train: make([]bool, n)}
	for i := range d.Tokens {
		d.Tokens[i] = int32(i + 1)
		d.Train[i] = i >= trainFrom
	}
	return d
}

func TestTokenizeTruncatesDropsAndKeepsOrder(t *testing.T) {
	recs := make([]Record, 50)
	for i := range recs {
		recs[i] = Record{Source: "f", Line: i + 1, Kind: FormatPromptCompletion, Prompt: strings.Repeat("p", i%7), Completion: strings.Repeat("c", 1+i%5)}
	}
	enc := func(r Record) (Document, error) {
		d := Document{}
		for _, c := range r.Prompt + r.Completion {
			d.Tokens = append(d.Tokens, c)
		}
		for i := range d.Tokens {
			d.Train = append(d.Train, i >= len(r.Prompt))
		}
		return d, nil
	}
	const maxLen = 6
	serial, st1, err := Tokenize(recs, enc, maxLen, 1)
	if err != nil {
		t.Fatal(err)
	}
	parallel, st4, err := Tokenize(recs, enc, maxLen, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(serial, parallel) || st1 != st4 {
		t.Fatal("tokenization depends on the number of workers")
	}
	wantTrunc, wantDrop := 0, 0
	for _, r := range recs {
		n := len(r.Prompt) + len(r.Completion)
		if n > maxLen {
			wantTrunc++
		}
		if len(r.Prompt) >= maxLen || (len(r.Prompt) == 0 && min(n, maxLen) < 2) {
			wantDrop++
		}
	}
	if st1.Truncated != wantTrunc || st1.Dropped != wantDrop || st1.Documents != len(recs)-wantDrop {
		t.Fatalf("stats %+v, want truncated %d dropped %d", st1, wantTrunc, wantDrop)
	}
	for _, d := range serial {
		if len(d.Tokens) > maxLen || d.Targets() == 0 {
			t.Fatalf("kept a bad document %+v", d)
		}
	}
	bad := func(r Record) (Document, error) { return Document{}, fmt.Errorf("unknown role") }
	if _, _, err := Tokenize(recs, bad, maxLen, 2); err == nil || !strings.Contains(err.Error(), "f:1: unknown role") {
		t.Fatalf("error %v, want it to name the record", err)
	}
}

func TestAssembleTargetsAndPositions(t *testing.T) {
	docs := []Document{
		{Tokens: []int32{10, 11, 12}, Train: []bool{false, false, true}},
		{Tokens: []int32{20, 21}, Train: []bool{true, true}},
	}
	b := Assemble(docs, []int{1, 0})
	want := Batch{
		Tokens:    []int32{20, 21, 10, 11, 12},
		Positions: []int32{0, 1, 0, 1, 2},
		DocStarts: []int32{0, 2, 5},
		Targets:   []int32{21, IgnoreIndex, IgnoreIndex, 12, IgnoreIndex},
	}
	if !reflect.DeepEqual(b, want) {
		t.Fatalf("got %+v\nwant %+v", b, want)
	}
	if b.NumTargets() != 2 || b.Docs() != 2 || b.Len() != 5 {
		t.Fatalf("counts: targets %d docs %d len %d", b.NumTargets(), b.Docs(), b.Len())
	}
}

func TestPackBestFitDecreasingInvariants(t *testing.T) {
	for _, tc := range []struct{ n, budget, maxLen int }{{1, 8, 8}, {100, 64, 64}, {500, 256, 64}, {300, 1000, 17}} {
		t.Run(fmt.Sprintf("n%d_b%d", tc.n, tc.budget), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.n)))
			lengths := make([]int, tc.n)
			total := 0
			for i := range lengths {
				lengths[i] = 1 + rng.IntN(tc.maxLen)
				total += lengths[i]
			}
			bins, err := PackBestFitDecreasing(lengths, tc.budget)
			if err != nil {
				t.Fatal(err)
			}
			seen := make([]int, tc.n)
			for _, b := range bins {
				sum := 0
				for _, i := range b {
					seen[i]++
					sum += lengths[i]
				}
				if sum > tc.budget || len(b) == 0 {
					t.Fatalf("bin of %d tokens (%d docs) breaks budget %d", sum, len(b), tc.budget)
				}
			}
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("document %d placed %d times", i, c)
				}
			}
			// Best fit decreasing never needs more than 11/9 OPT + 1 bins; OPT >= total/budget.
			lower := (total + tc.budget - 1) / tc.budget
			if len(bins) > lower*11/9+1 {
				t.Fatalf("%d bins for %d tokens in budget %d (lower bound %d)", len(bins), total, tc.budget, lower)
			}
		})
	}
	// A known case where best fit (not first fit) matters: [5,4,3,3,1] into 8 ->
	// 5 opens bin0(3 free), 4 opens bin1(4 free), 3 -> bin0 (tightest), 3 -> bin1, 1 -> bin1.
	bins, err := PackBestFitDecreasing([]int{3, 5, 1, 4, 3}, 8)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]int{{1, 0}, {3, 4, 2}}; !reflect.DeepEqual(bins, want) {
		t.Fatalf("bins %v, want %v", bins, want)
	}
	if _, err := PackBestFitDecreasing([]int{3, 9}, 8); err == nil || !strings.Contains(err.Error(), "document 1 has 9 tokens") {
		t.Fatalf("oversized document: %v", err)
	}
}

func testDocs(n int, seed uint64) []Document {
	rng := rand.New(rand.NewPCG(seed, 7))
	docs := make([]Document, n)
	for i := range docs {
		docs[i] = charDoc(2+rng.IntN(15), 1)
		docs[i].Tokens[0] = int32(1000 + i) // identity of the document
	}
	return docs
}

func epochTokens(t *testing.T, l *Loader) [][]int32 {
	t.Helper()
	var out [][]int32
	for range l.BatchesPerEpoch() {
		b, err := l.Next()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b.Tokens)
	}
	return out
}

func TestLoaderPackingKeepsEveryTokenAndRestartsPositions(t *testing.T) {
	docs := testDocs(200, 1)
	opts := LoaderOptions{Packing: true, BatchSize: 2, MaxLength: 16, Shuffle: true, Seed: 3}
	l, err := NewLoader(docs, opts)
	if err != nil {
		t.Fatal(err)
	}
	for epoch := 0; epoch < 2; epoch++ {
		seen := map[int32]int{}
		tokens := 0
		for range l.BatchesPerEpoch() {
			b, err := l.Next()
			if err != nil {
				t.Fatal(err)
			}
			if b.Len() > opts.Budget() {
				t.Fatalf("micro-batch of %d tokens over budget %d", b.Len(), opts.Budget())
			}
			tokens += b.Len()
			for d := 0; d < b.Docs(); d++ {
				s, e := b.DocStarts[d], b.DocStarts[d+1]
				seen[b.Tokens[s]]++
				doc := docs[b.Tokens[s]-1000]
				if int(e-s) != len(doc.Tokens) {
					t.Fatalf("document %d has %d tokens in the batch, %d in the dataset", b.Tokens[s]-1000, e-s, len(doc.Tokens))
				}
				for i := s; i < e; i++ {
					if b.Positions[i] != i-s {
						t.Fatalf("position %d at offset %d of a document", b.Positions[i], i-s)
					}
				}
				if b.Targets[e-1] != IgnoreIndex {
					t.Fatal("last token of a document has a target (crosses the boundary)")
				}
			}
		}
		if len(seen) != len(docs) {
			t.Fatalf("epoch %d saw %d of %d documents", epoch, len(seen), len(docs))
		}
		for id, c := range seen {
			if c != 1 {
				t.Fatalf("epoch %d: document %d seen %d times", epoch, id-1000, c)
			}
		}
		total := 0
		for _, d := range docs {
			total += len(d.Tokens)
		}
		if tokens != total {
			t.Fatalf("epoch %d: %d tokens, dataset has %d", epoch, tokens, total)
		}
	}
	if c := l.Cursor(); c != (Cursor{Epoch: 2}) {
		t.Fatalf("cursor after two epochs %+v", c)
	}
}

func TestLoaderShuffleDeterminism(t *testing.T) {
	docs := testDocs(120, 2)
	mk := func(seed uint64, shuffle bool) *Loader {
		l, err := NewLoader(docs, LoaderOptions{Packing: true, BatchSize: 3, MaxLength: 16, Shuffle: shuffle, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a0, a1 := epochTokens(t, mk(5, true)), [][]int32(nil)
	la := mk(5, true)
	_ = epochTokens(t, la)
	a1 = epochTokens(t, la)
	b0 := epochTokens(t, mk(5, true))
	c0 := epochTokens(t, mk(6, true))
	if !reflect.DeepEqual(a0, b0) {
		t.Fatal("same seed gave different orders")
	}
	if reflect.DeepEqual(a0, c0) {
		t.Fatal("different seeds gave the same order")
	}
	if reflect.DeepEqual(a0, a1) {
		t.Fatal("epochs 0 and 1 have the same order")
	}
	u0, u1 := epochTokens(t, mk(5, false)), epochTokens(t, mk(9, false))
	if !reflect.DeepEqual(u0, u1) {
		t.Fatal("unshuffled order depends on the seed")
	}
}

func TestLoaderSeekResumesExactly(t *testing.T) {
	docs := testDocs(80, 3)
	opts := LoaderOptions{Packing: true, BatchSize: 2, MaxLength: 16, Shuffle: true, Seed: 11}
	full, _ := NewLoader(docs, opts)
	var want [][]int32
	for range full.BatchesPerEpoch()*2 + 3 {
		b, _ := full.Next()
		want = append(want, b.Tokens)
	}
	for _, stop := range []int{1, full.BatchesPerEpoch() - 1, full.BatchesPerEpoch() + 2} {
		first, _ := NewLoader(docs, opts)
		for range stop {
			first.Next()
		}
		c := first.Cursor()
		second, _ := NewLoader(docs, opts)
		if err := second.Seek(c); err != nil {
			t.Fatal(err)
		}
		for i := stop; i < len(want); i++ {
			b, _ := second.Next()
			if !slices.Equal(b.Tokens, want[i]) {
				t.Fatalf("resumed at %+v: micro-batch %d differs", c, i)
			}
		}
	}
	l, _ := NewLoader(docs, opts)
	if err := l.Seek(Cursor{Epoch: 0, Index: l.BatchesPerEpoch()}); err == nil {
		t.Fatal("Seek past the epoch accepted")
	}
}

func TestLoaderWithoutPacking(t *testing.T) {
	docs := testDocs(10, 4)
	l, err := NewLoader(docs, LoaderOptions{BatchSize: 4, MaxLength: 16})
	if err != nil {
		t.Fatal(err)
	}
	if l.BatchesPerEpoch() != 3 {
		t.Fatalf("%d micro-batches, want 3", l.BatchesPerEpoch())
	}
	all, _ := l.All(0)
	if all[0].Docs() != 4 || all[2].Docs() != 2 || all[0].Tokens[0] != 1000 {
		t.Fatalf("unexpected layout: %d, %d docs", all[0].Docs(), all[2].Docs())
	}
}

func TestSplit(t *testing.T) {
	recs := make([]Record, 100)
	for i := range recs {
		recs[i].Line = i + 1
	}
	tr, ev, err := Split(recs, 0.1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 10 || len(tr) != 90 {
		t.Fatalf("split %d/%d", len(tr), len(ev))
	}
	tr2, ev2, _ := Split(recs, 0.1, 1)
	if !reflect.DeepEqual(ev, ev2) || !reflect.DeepEqual(tr, tr2) {
		t.Fatal("split is not deterministic")
	}
	_, ev3, _ := Split(recs, 0.1, 2)
	if reflect.DeepEqual(ev, ev3) {
		t.Fatal("split ignores the seed")
	}
	lines := map[int]bool{}
	for _, r := range append(tr, ev...) {
		lines[r.Line] = true
	}
	if len(lines) != 100 {
		t.Fatal("split lost or duplicated records")
	}
	for _, f := range []float64{1, 1.5, 0.999} {
		if _, _, err := Split(recs, f, 1); err == nil {
			t.Fatalf("eval_split %v accepted", f)
		}
	}
}

func TestArithmeticDisjointDeterministicAndRoundTrips(t *testing.T) {
	o := ArithmeticOptions{Seed: 1, MaxOperand: 20, Train: 300, Eval: 40}
	tr, ev, err := Arithmetic(o)
	if err != nil {
		t.Fatal(err)
	}
	tr2, ev2, _ := Arithmetic(o)
	if !reflect.DeepEqual(tr, tr2) || !reflect.DeepEqual(ev, ev2) {
		t.Fatal("not deterministic")
	}
	seen := map[string]bool{}
	for _, r := range append(append([]Record{}, ev...), tr...) {
		q := r.Messages[0].Content
		if seen[q] {
			t.Fatalf("problem %q drawn twice (held-out leaks into training?)", q)
		}
		seen[q] = true
		var a, b, c int
		if _, err := fmt.Sscanf(q, "What is %d+%d?", &a, &b); err != nil {
			t.Fatalf("question %q: %v", q, err)
		}
		fmt.Sscan(r.Messages[1].Content, &c)
		if a+b != c || a > 20 || b > 20 {
			t.Fatalf("%q answered %q", q, r.Messages[1].Content)
		}
	}
	var sb strings.Builder
	if err := WriteJSONL(&sb, tr); err != nil {
		t.Fatal(err)
	}
	back, err := Read(strings.NewReader(sb.String()), "train", FormatMessages)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, tr) {
		t.Fatal("JSONL round trip changed the records")
	}
	if _, _, err := Arithmetic(ArithmeticOptions{MaxOperand: 3, Train: 10, Eval: 7}); err == nil {
		t.Fatal("more problems than exist accepted")
	}
}

func TestTokensRecordsRoundTripThroughJSONL(t *testing.T) {
	recs := []Record{
		{Source: "tok", Line: 1, Kind: FormatTokens, IDs: []int32{0, 151935, 7}},
		{Source: "tok", Line: 2, Kind: FormatTokens, IDs: []int32{3, 3}},
	}
	var sb strings.Builder
	if err := WriteJSONL(&sb, recs); err != nil {
		t.Fatal(err)
	}
	if want := "{\"input_ids\":[0,151935,7]}\n{\"input_ids\":[3,3]}\n"; sb.String() != want {
		t.Fatalf("wrote %q, want %q", sb.String(), want)
	}
	back, err := Read(strings.NewReader(sb.String()), "tok", FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, recs) {
		t.Fatalf("round trip gave %+v, want %+v", back, recs)
	}
}
