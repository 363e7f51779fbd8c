package data

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
)

// ArithmeticOptions describe a synthetic chat dataset of additions, "What is 37+48?" -> "85".
type ArithmeticOptions struct {
	// Seed fixes which problems are drawn and which are held out.
	Seed uint64
	// MaxOperand is the largest operand; operands are drawn from [0, MaxOperand].
	MaxOperand int
	// Train and Eval are the numbers of training and held-out problems. No held-out problem
	// (a, b) appears in the training set.
	Train, Eval int
}

// Arithmetic draws distinct addition problems as chat records: the train set and a disjoint
// held-out set. The same options always give the same records.
func Arithmetic(o ArithmeticOptions) (train, eval []Record, err error) {
	if o.MaxOperand < 1 || o.MaxOperand > 1_000_000 {
		return nil, nil, fmt.Errorf("data: arithmetic: max operand %d must be in [1, 1000000]", o.MaxOperand)
	}
	n := (o.MaxOperand + 1) * (o.MaxOperand + 1)
	if o.Train < 1 || o.Eval < 0 || o.Train+o.Eval > n {
		return nil, nil, fmt.Errorf("data: arithmetic: %d train + %d eval problems: need at least 1 train and at most %d distinct problems with operands up to %d", o.Train, o.Eval, n, o.MaxOperand)
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0xa817))
	// Draw distinct problem indices by a partial Fisher-Yates over a sparse permutation.
	swapped := map[int]int{}
	at := func(i int) int {
		if v, ok := swapped[i]; ok {
			return v
		}
		return i
	}
	problem := func(k int) Record {
		a, b := k/(o.MaxOperand+1), k%(o.MaxOperand+1)
		return Record{Kind: FormatMessages, Messages: []Message{
			{Role: "user", Content: "What is " + strconv.Itoa(a) + "+" + strconv.Itoa(b) + "?"},
			{Role: "assistant", Content: strconv.Itoa(a + b)},
		}}
	}
	for i := 0; i < o.Train+o.Eval; i++ {
		j := i + rng.IntN(n-i)
		vi, vj := at(i), at(j)
		swapped[i], swapped[j] = vj, vi
		r := problem(vj)
		if i < o.Eval {
			r.Source, r.Line = "eval", i+1
			eval = append(eval, r)
		} else {
			r.Source, r.Line = "train", i-o.Eval+1
			train = append(train, r)
		}
	}
	return train, eval, nil
}

// WriteJSONL writes records as JSONL in their own format ({"text"}, {"messages"},
// {"prompt","completion"} or {"input_ids"}).
func WriteJSONL(w io.Writer, recs []Record) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for _, r := range recs {
		var v any
		switch r.Kind {
		case FormatText:
			v = struct {
				Text string `json:"text"`
			}{r.Text}
		case FormatMessages:
			v = struct {
				Messages []Message `json:"messages"`
			}{r.Messages}
		case FormatPromptCompletion:
			v = struct {
				Prompt     string `json:"prompt"`
				Completion string `json:"completion"`
			}{r.Prompt, r.Completion}
		case FormatTokens:
			v = struct {
				InputIDs []int32 `json:"input_ids"`
			}{r.IDs}
		default:
			return fmt.Errorf("data: %s: record of unknown kind %q", r.Where(), r.Kind)
		}
		if err := enc.Encode(v); err != nil {
			return err
		}
	}
	return bw.Flush()
}
