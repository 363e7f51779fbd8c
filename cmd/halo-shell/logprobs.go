package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/backend"
	_ "github.com/halo-shell/halo-shell/engine/backend/cpu" // registers the cpu device
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func init() {
	var modelDir, adapterDir, ids, device, dtype string
	cmd := &cobra.Command{
		Use:   "logprobs",
		Short: "Print log p(ids[t] | ids[:t]) of a token sequence as JSON",
		Long: `Loads a Hugging Face checkpoint and prints {"logprobs": [...]}: the float32 log-probability
of each token given the ones before it (n-1 values for n ids). This is the contract used to check
numerical parity with transformers.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			seq, err := parseIDs(ids)
			if err != nil {
				return err
			}
			m, b, err := openModel(modelDir, adapterDir, device, dtype)
			if err != nil {
				return err
			}
			defer b.Close()
			defer m.Close()
			lp, err := m.Logprobs(seq)
			if err != nil {
				return err
			}
			if err := finiteLogprobs(m, lp); err != nil {
				return err
			}
			vals := make([]json.Number, len(lp))
			for i, v := range lp {
				vals[i] = json.Number(strconv.FormatFloat(float64(v), 'g', -1, 32))
			}
			out, err := json.Marshal(map[string]any{"logprobs": vals})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), string(out))
			return err
		},
	}
	cmd.Flags().StringVar(&modelDir, "model", "", "checkpoint directory (config.json + safetensors)")
	cmd.Flags().StringVar(&adapterDir, "adapter", "", "LoRA adapter directory (PEFT's adapter_config.json + adapter_model.safetensors) applied over --model")
	cmd.Flags().StringVar(&ids, "ids", "", `token ids separated by spaces or commas, e.g. "5 17 123"`)
	cmd.Flags().StringVar(&device, "device", "cpu", "device: cpu, cuda, cuda:N or auto")
	cmd.Flags().StringVar(&dtype, "dtype", "f32", "compute dtype: f32 or bf16")
	_ = cmd.MarkFlagRequired("model")
	_ = cmd.MarkFlagRequired("ids")
	runCmd.AddCommand(cmd)
}

// parseIDs reads token ids separated by spaces and/or commas.
func parseIDs(s string) ([]int32, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '[' || r == ']' })
	ids := make([]int32, len(fields))
	for i, f := range fields {
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("--ids: item %d (%q) is not a non-negative token id", i+1, f)
		}
		ids[i] = int32(v)
	}
	if len(ids) < 2 {
		return nil, fmt.Errorf("--ids: need at least 2 token ids, got %d", len(ids))
	}
	return ids, nil
}

// finiteLogprobs returns an error naming the cause when a log-probability is NaN or
// infinite (JSON has no such numbers): the first weight tensor that holds non-finite values,
// or, when every weight is finite, an overflow in the forward pass.
func finiteLogprobs(m *models.Model, lp []float32) error {
	pos := -1
	for i, v := range lp {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			pos = i
			break
		}
	}
	if pos < 0 {
		return nil
	}
	what := fmt.Sprintf("logprobs: the log-probability of ids[%d] is %v", pos+1, lp[pos])
	for _, s := range m.Specs {
		vals, err := m.ParamFloat32(s.Name)
		if err != nil {
			return fmt.Errorf("%s; reading the weights to find why: %w", what, err)
		}
		nan, inf := 0, 0
		for _, v := range vals {
			switch {
			case math.IsNaN(float64(v)):
				nan++
			case math.IsInf(float64(v), 0):
				inf++
			}
		}
		if nan+inf > 0 {
			return fmt.Errorf("%s: weight %q holds %d NaN and %d infinite values of %d; the checkpoint is damaged", what, s.Name, nan, inf, len(vals))
		}
	}
	return fmt.Errorf("%s although every weight is finite: the forward pass overflowed (with --dtype bf16, try f32)", what)
}

// openModel opens a device and loads a checkpoint onto it, with the LoRA adapter saved in
// adapter when that is not empty.
func openModel(dir, adapter, device, dtype string) (*models.Model, backend.Backend, error) {
	dt, err := tensor.ParseDType(dtype)
	if err != nil {
		return nil, nil, fmt.Errorf("--dtype: %w", err)
	}
	b, note, err := backend.Resolve(device)
	if err != nil {
		return nil, nil, err
	}
	if note != "" {
		fmt.Fprintln(rootCmd.ErrOrStderr(), "halo-shell:", note)
	}
	m, err := models.Load(dir, b, models.Options{DType: dt})
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	if len(m.Unused) > 0 {
		fmt.Fprintf(rootCmd.ErrOrStderr(), "halo-shell: %s: ignoring %d checkpoint tensors the model does not use (%s)\n",
			dir, len(m.Unused), strings.Join(m.Unused[:min(len(m.Unused), 5)], ", "))
	}
	if adapter != "" {
		if err := m.LoadAdapter(adapter); err != nil {
			m.Close()
			b.Close()
			return nil, nil, err
		}
	}
	return m, b, nil
}
