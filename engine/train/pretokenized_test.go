package train

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// tinyCheckpoint saves a random tiny llama (vocab 256) with no tokenizer files and returns
// its directory.
func tinyCheckpoint(t *testing.T) string {
	t.Helper()
	b, err := backend.Open("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dir := filepath.Join(t.TempDir(), "ckpt")
	spec := models.InitSpec{Arch: "llama", Preset: "tiny", OutDir: dir, Seed: 3, DType: tensor.F32,
		Set: []string{"hidden_size=32", "intermediate_size=64", "num_attention_heads=2", "num_key_value_heads=1",
			"head_dim=16", "tie_word_embeddings=true"}}
	if _, err := models.InitCheckpoint(b, spec); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cycleRows are rows of token ids cycling through a short period, each starting elsewhere.
func cycleRows(n, length int) []data.Record {
	recs := make([]data.Record, n)
	for i := range recs {
		ids := make([]int32, length)
		for j := range ids {
			ids[j] = int32(10 + (i+j)%7)
		}
		recs[i] = data.Record{Kind: data.FormatTokens, IDs: ids}
	}
	return recs
}

func tokensConfig(t *testing.T, model, dataPath string, extra ...string) *Config {
	t.Helper()
	y := fmt.Sprintf(`model_name_or_path: %s
dataset: {path: %s, format: tokens, shuffle: false}
packing: false
max_length: 16
per_device_train_batch_size: 2
learning_rate: 1e-2
lr_scheduler_type: constant
max_steps: 4
device: cpu
output_dir: %s
`, model, dataPath, filepath.Join(t.TempDir(), "out"))
	cfg, err := ParseConfig([]byte(y), "tokens.yaml", MethodPretrain, extra)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestPretokenizedDataTrainsWithoutATokenizerInFileOrder(t *testing.T) {
	model := tinyCheckpoint(t)
	recs := cycleRows(8, 16)
	path := writeJSONL(t, t.TempDir(), "ids.jsonl", recs)
	tr := newTrainer(t, tokensConfig(t, model, path))
	if tr.Stats.Targets != 8*15 {
		t.Fatalf("%d targets, want every token after the first of 8 rows of 16 (%d)", tr.Stats.Targets, 8*15)
	}
	// Without shuffling or packing, micro-batch i holds rows 2i and 2i+1, in that order.
	for i := range 4 {
		b, err := tr.loader.Next()
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Concat(recs[2*i].IDs, recs[2*i+1].IDs)
		if !slices.Equal(b.Tokens, want) || !slices.Equal(b.DocStarts, []int32{0, 16, 32}) {
			t.Fatalf("micro-batch %d holds %v (documents %v), want rows %d and %d: %v", i, b.Tokens, b.DocStarts, 2*i, 2*i+1, want)
		}
		if b.NumTargets() != 30 {
			t.Fatalf("micro-batch %d has %d targets, want 30", i, b.NumTargets())
		}
	}
	if err := tr.loader.Seek(data.Cursor{}); err != nil {
		t.Fatal(err)
	}
	losses := steps(t, tr, 4)
	if !(losses[3] < losses[0]-0.5) {
		t.Fatalf("losses %v: a periodic sequence should be learnt within 4 steps at lr 1e-2", losses)
	}
	if _, err := tr.Complete("hi", false, 2); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("Complete without a tokenizer: %v, want an error naming the missing tokenizer.json", err)
	}
	// A saved checkpoint holds the model, and no tokenizer files that never existed.
	out := filepath.Join(t.TempDir(), "saved")
	if err := tr.Save(out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "config.json")); err != nil {
		t.Fatal(err)
	}
}

func TestPretokenizedDataErrors(t *testing.T) {
	model := tinyCheckpoint(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body, format, want string
	}{
		{"id beyond the vocabulary", "{\"input_ids\":[1,2]}\n{\"input_ids\":[3,256,4]}\n", "tokens",
			`bad.jsonl:2: input_ids[1] = 256 is not below the model's vocab_size 256`},
		{"text record in a tokens file", "{\"text\":\"hello\"}\n", "tokens",
			`bad.jsonl:1: format is tokens but the record has no "input_ids" key`},
		{"auto format needs a tokenizer", "{\"input_ids\":[1,2]}\n", "auto", "tokenizer.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "bad.jsonl")
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := New(tokensConfig(t, model, p, "--dataset.format="+tc.format))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestShuffleDefaultsOnAndReordersBatches(t *testing.T) {
	model := tinyCheckpoint(t)
	recs := cycleRows(16, 16)
	path := writeJSONL(t, t.TempDir(), "ids.jsonl", recs)
	cfg := tokensConfig(t, model, path, "--dataset.shuffle=true")
	tr := newTrainer(t, cfg)
	var first []int32
	inOrder := true
	for i := range 8 {
		b, err := tr.loader.Next()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = b.Tokens
		}
		inOrder = inOrder && slices.Equal(b.Tokens, slices.Concat(recs[2*i].IDs, recs[2*i+1].IDs))
	}
	if inOrder {
		t.Fatalf("shuffle: true read 16 rows in file order (first batch %v)", first)
	}
	c, err := ParseConfig([]byte("model_name_or_path: m\ndataset: {path: d}\noutput_dir: o\n"), "x.yaml", MethodPretrain, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dataset.Shuffle == nil || !*c.Dataset.Shuffle {
		t.Fatal("dataset.shuffle does not default to true")
	}
}
