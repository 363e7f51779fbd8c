package data

import (
	"reflect"
	"strings"
	"testing"
)

func TestReadPreferenceRows(t *testing.T) {
	src := strings.Join([]string{
		`{"prompt": "2+2=", "chosen": "4", "rejected": "5"}`,
		`{"prompt": "3+3=", "chosen": "6"}`,
		``,
		`{"prompt": "1+1=", "chosen": "", "rejected": "3"}`,
		`not json`,
		`{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hello"}], "rejected": [{"role": "assistant", "content": "go away"}]}`,
		`{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "good"}], "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "bad"}]}`,
		`{"prompt": "x", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}`,
		`{"chosen": "a", "rejected": "b"}`,
		`{"prompt": "p", "chosen": 7, "rejected": "b"}`,
	}, "\n")
	recs, bad, err := ReadPreference(strings.NewReader(src), "p.jsonl", Paired)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("got %d good rows, want 3 (lines 1, 6, 7): %+v", len(recs), recs)
	}
	if r := recs[0]; r.Line != 1 || r.Prompt.Text != "2+2=" || r.Chosen.Text != "4" || r.Rejected.Text != "5" || r.Prompt.Chat {
		t.Errorf("row 1 = %+v", r)
	}
	if r := recs[1]; r.Line != 6 || !r.Prompt.Chat || r.Chosen.Messages[0].Content != "hello" {
		t.Errorf("row 6 = %+v", r)
	}
	// The implicit prompt: the shared leading messages.
	if r := recs[2]; r.Line != 7 || len(r.Prompt.Messages) != 1 || r.Prompt.Messages[0].Content != "q" ||
		len(r.Chosen.Messages) != 1 || r.Chosen.Messages[0].Content != "good" || r.Rejected.Messages[0].Content != "bad" {
		t.Errorf("row 7 = %+v", r)
	}
	want := map[int]string{
		2:  `missing "rejected"`,
		4:  "empty completion",
		5:  "not a JSON object",
		8:  "text and messages mixed in one row",
		9:  `missing "prompt"`,
		10: `"chosen" is not text or a list of messages`,
	}
	got := map[int]string{}
	for _, b := range bad {
		got[b.Line] = b.Reason
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("bad rows %v, want %v", got, want)
	}
	sum := SummarizeBadRows(bad, 10)
	for _, w := range []string{"dropped 6 of 10 rows", `1 missing "rejected" (p.jsonl:2)`, "p.jsonl:4"} {
		if !strings.Contains(sum, w) {
			t.Errorf("summary %q lacks %q", sum, w)
		}
	}
}

func TestReadUnpaired(t *testing.T) {
	src := `{"prompt": "a", "completion": "b", "label": true}
{"prompt": "a", "completion": "c", "label": "yes"}
{"prompt": "a", "completion": "", "label": false}
{"prompt": "a", "completion": "d", "label": false}
{"prompt": "a", "completion": "d"}`
	recs, bad, err := ReadPreference(strings.NewReader(src), "u.jsonl", Unpaired)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || !recs[0].Label || recs[1].Label || recs[1].Completion.Text != "d" {
		t.Fatalf("rows %+v", recs)
	}
	reasons := []string{}
	for _, b := range bad {
		reasons = append(reasons, b.Where()+" "+b.Reason)
	}
	want := []string{`u.jsonl:2 "label" is not true or false`, "u.jsonl:3 empty completion", `u.jsonl:5 missing "label"`}
	if !reflect.DeepEqual(reasons, want) {
		t.Errorf("bad rows %q, want %q", reasons, want)
	}
}

func TestReadPreferenceNoGoodRow(t *testing.T) {
	_, _, err := ReadPreference(strings.NewReader(`{"prompt": "a"}`), "x.jsonl", Paired)
	if err == nil {
		t.Fatal("a file of bad rows was accepted")
	}
}

// TestAssembleSegments checks that a segmented document becomes one sequence per segment,
// with positions restarting, no target across the boundary, and Sources/Segs naming them.
func TestAssembleSegments(t *testing.T) {
	docs := []Document{
		{Tokens: []int32{1, 2, 3}, Train: []bool{false, true, true}},
		{Tokens: []int32{5, 6, 7, 5, 6, 8}, Train: []bool{false, false, true, false, false, true}, Segments: []int32{0, 3}},
	}
	b := Assemble(docs, []int{1, 0})
	want := Batch{
		Tokens:    []int32{5, 6, 7, 5, 6, 8, 1, 2, 3},
		Positions: []int32{0, 1, 2, 0, 1, 2, 0, 1, 2},
		DocStarts: []int32{0, 3, 6, 9},
		Targets:   []int32{-100, 7, -100, -100, 8, -100, 2, 3, -100},
		Sources:   []int32{1, 1, 0},
		Segs:      []int32{0, 1, 0},
	}
	if !reflect.DeepEqual(b, want) {
		t.Fatalf("Assemble = %+v\nwant       %+v", b, want)
	}
	plain := Assemble(docs, []int{0})
	if plain.Sources != nil || plain.Segs != nil {
		t.Fatalf("a batch without segmented documents got Sources %v Segs %v", plain.Sources, plain.Segs)
	}
	if _, err := NewLoader([]Document{{Tokens: []int32{1, 2}, Train: []bool{false, true}, Segments: []int32{0, 2}}}, LoaderOptions{BatchSize: 1, MaxLength: 4}); err == nil {
		t.Fatal("a segment starting past the document's end was accepted")
	}
}
