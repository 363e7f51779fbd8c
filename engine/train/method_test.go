package train

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestStepMetricsJSONMethodKeys checks that a method's metrics are top-level keys of a
// metrics.jsonl row under their own names and read back into Method.
func TestStepMetricsJSONMethodKeys(t *testing.T) {
	el := 0.5
	m := StepMetrics{Step: 3, Loss: 0.69, EvalLoss: &el, Method: map[string]float64{"rewards/chosen": 0.25, "rewards/accuracies": 1}}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var row map[string]any
	if err := json.Unmarshal(b, &row); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if row["rewards/chosen"] != 0.25 || row["rewards/accuracies"] != 1.0 || row["loss"] != 0.69 || row["step"] != 3.0 {
		t.Fatalf("row %s lacks the method's keys or the common ones", b)
	}
	var back StepMetrics
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Step != 3 || back.Loss != 0.69 || back.EvalLoss == nil || *back.EvalLoss != 0.5 {
		t.Fatalf("round trip lost common fields: %+v", back)
	}
	if len(back.Method) != 2 || back.Method["rewards/chosen"] != 0.25 {
		t.Fatalf("round trip Method = %v", back.Method)
	}
	plain, _ := json.Marshal(StepMetrics{Step: 1})
	var back2 StepMetrics
	_ = json.Unmarshal(plain, &back2)
	if back2.Method != nil {
		t.Fatalf("a row without method keys read back Method %v", back2.Method)
	}
}

func TestMetricsMeans(t *testing.T) {
	a := Metrics{}
	a.Add("rewards/accuracies", 1, 2)
	b := Metrics{}
	b.Add("rewards/accuracies", 0, 2)
	b.Add("kl", 0.3, 1)
	a.Merge(b)
	v := a.Values()
	if v["rewards/accuracies"] != 0.25 || v["kl"] != 0.3 {
		t.Fatalf("values %v, want accuracies 0.25 (1 of 4), kl 0.3", v)
	}
}

func TestStepAtProgress(t *testing.T) {
	for _, tc := range []struct {
		at   StepAt
		want float64
	}{{StepAt{1, 10}, 0}, {StepAt{6, 10}, 0.5}, {StepAt{20, 10}, 1}, {StepAt{1, 0}, 1}} {
		if got := tc.at.Progress(); got != tc.want {
			t.Errorf("%+v.Progress() = %v, want %v", tc.at, got, tc.want)
		}
	}
}

// TestMethodKeysRefused checks that a key of another method is refused naming who reads it,
// and an unknown method names the registered ones.
func TestMethodKeysRefused(t *testing.T) {
	base := "model_name_or_path: m\ndataset: d.jsonl\noutput_dir: o\n"
	_, err := ParseConfig([]byte(base+"beta: 0.2\n"), "c.yaml", MethodSFT, nil)
	if err == nil || !strings.Contains(err.Error(), "method sft does not read beta") {
		t.Fatalf("beta on sft: err = %v, want it refused", err)
	}
	_, err = ParseConfig([]byte(base), "c.yaml", "nosuch", nil)
	if err == nil || !strings.Contains(err.Error(), "sft") || !strings.Contains(err.Error(), "pretrain") {
		t.Fatalf("unknown method: err = %v, want the registered methods named", err)
	}
	if _, err := LookupMethod("sfy"); err == nil || !strings.Contains(err.Error(), `did you mean "sft"`) {
		t.Fatalf("LookupMethod(sfy) = %v", err)
	}
}
