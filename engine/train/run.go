package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/engine/data"
)

// MetricsFile is the per-step metrics log in output_dir: one JSON object per optimizer step.
const MetricsFile = "metrics.jsonl"

// RunOptions say where a batch run reports.
type RunOptions struct {
	// Progress receives the progress display (usually stderr); nil for none.
	Progress io.Writer
	// TTY redraws one progress line in place; otherwise a plain line every logging_steps.
	TTY bool
	// Log receives messages (setup summary, checkpoints, results); nil for none.
	Log io.Writer
	// OnStep, if set, is called with every step's metrics.
	OnStep func(StepMetrics)
}

// RunResult summarises a batch run.
type RunResult struct {
	Steps      int
	FinalLoss  float64
	EvalLoss   *float64
	Generation *GenerationResult
	Elapsed    time.Duration
}

// Run trains until the planned number of steps: it appends every step's metrics to
// output_dir/metrics.jsonl, shows progress, evaluates every eval_steps and at the end, writes
// output_dir/checkpoint-N every save_steps and at the end, then writes the final Hugging Face
// model into output_dir and, when generation_eval.max_samples > 0, measures held-out
// exact-match accuracy. On a run across nodes every node runs the same steps, evaluations and
// checkpoint collectives, but only node 0 writes files and shows progress; the other nodes log
// one summary line. When ctx is cancelled it stops at the next step boundary, saves a
// checkpoint (on one node; see NodeDevices for runs across nodes) and returns ctx's error.
func Run(ctx context.Context, t *Trainer, o RunOptions) (RunResult, error) {
	var res RunResult
	cfg := t.Cfg
	out := cfg.Run.OutputDir
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	lead := t.lead()
	node, nodes := t.Node()
	var enc *json.Encoder // metrics.jsonl, on the node that writes files
	if lead {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return res, fmt.Errorf("train: output_dir: %w", err)
		}
		if err := cleanStale(out, ""); err != nil {
			return res, fmt.Errorf("train: output_dir: %w", err)
		}
		flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
		if t.step > 0 {
			flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
			if err := trimMetrics(filepath.Join(out, MetricsFile), t.step); err != nil {
				return res, fmt.Errorf("train: %s: %w", MetricsFile, err)
			}
		}
		mf, err := os.OpenFile(filepath.Join(out, MetricsFile), flags, 0o644)
		if err != nil {
			return res, fmt.Errorf("train: %w", err)
		}
		defer mf.Close()
		enc = json.NewEncoder(mf)
		logf("%s", t.Summary())
	} else {
		o.Progress = nil
	}
	start := time.Now()
	bar := newProgress(o.Progress, o.TTY, t.totalSteps, cfg.Run.LoggingSteps)
	var last StepMetrics
	for !t.Done() {
		if err := ctx.Err(); err != nil {
			bar.finish()
			if nodes > 1 {
				// The other nodes stop at their own step boundary: the optimizer state
				// cannot be gathered together.
				if lead {
					logf("interrupted: a run across nodes saves no checkpoint when interrupted; resume from the last checkpoint-N in %s", out)
				}
			} else if t.step > 0 {
				if dir, serr := t.SaveStep(); serr == nil {
					logf("interrupted: saved %s (resume with --resume_from_checkpoint=%s)", dir, dir)
				} else {
					logf("interrupted: saving a checkpoint failed: %v", serr)
				}
			}
			return res, err
		}
		m, err := t.Step(ctx)
		if err != nil {
			bar.finish()
			if errors.Is(err, context.Canceled) {
				continue
			}
			return res, err
		}
		if t.HasEval() && ((cfg.Run.EvalSteps > 0 && t.step%cfg.Run.EvalSteps == 0) || t.Done()) {
			el, ems, err := t.evalAll(ctx)
			if err != nil {
				bar.finish()
				return res, err
			}
			m.EvalLoss = &el
			for k, v := range ems.Values() {
				if m.Method == nil {
					m.Method = map[string]float64{}
				}
				m.Method["eval_"+k] = v
			}
		}
		if enc != nil {
			if err := enc.Encode(m); err != nil {
				return res, fmt.Errorf("train: %s: %w", MetricsFile, err)
			}
		}
		bar.update(m)
		if o.OnStep != nil {
			o.OnStep(m)
		}
		last = m
		// Every node takes part in a save: the optimizer state is gathered from every node.
		if s := *cfg.Run.SaveSteps; s > 0 && t.step%s == 0 && !t.Done() {
			bar.finish()
			dir, err := t.SaveStep()
			if err != nil {
				return res, err
			}
			if lead {
				logf("saved %s", dir)
			}
		}
	}
	bar.finish()
	res.Steps, res.FinalLoss, res.EvalLoss, res.Elapsed = t.step, last.Loss, last.EvalLoss, time.Since(start)
	if lead && last.Step > 0 {
		logf("trained %d steps in %s: loss %.4f", t.step, res.Elapsed.Round(time.Second), last.Loss)
		if last.EvalLoss != nil {
			logf("held-out loss %.4f", *last.EvalLoss)
		}
	}
	dir, err := t.SaveStep()
	if err != nil {
		return res, err
	}
	if !lead {
		// The final save gathered the parameters, so node 0's model and generation eval
		// need nothing more from this node.
		logf("node %d of %d: trained %d steps in %s: loss %.4f (node 0 writes the metrics, checkpoints and model)", node, nodes, t.step, res.Elapsed.Round(time.Second), last.Loss)
		return res, nil
	}
	logf("saved %s", dir)
	if err := t.SaveModel(out); err != nil {
		return res, err
	}
	if t.model.LoRA() != nil {
		logf("wrote the LoRA adapter (PEFT's adapter_config.json + adapter_model.safetensors) to %s", out)
	} else {
		logf("wrote the Hugging Face model to %s", out)
	}
	if g := cfg.GenerationEval; g.MaxSamples > 0 {
		gr, err := t.EvalGeneration(ctx, g.MaxSamples, g.MaxNewTokens)
		if err != nil {
			return res, err
		}
		res.Generation = &gr
		js, _ := json.MarshalIndent(gr, "", "  ")
		if err := os.WriteFile(filepath.Join(out, "generation_eval.json"), append(js, '\n'), 0o644); err != nil {
			return res, fmt.Errorf("train: %w", err)
		}
		for _, ex := range gr.Examples {
			logf("  %-24q -> %-8q (reference %q)", ex[0], ex[2], ex[1])
		}
		logf("held-out exact match: %d/%d = %.1f%% (chance: %.1f%%, always answering the most frequent training answer)",
			gr.Correct, gr.Samples, 100*gr.Accuracy, 100*gr.Chance)
	}
	return res, nil
}

// SaveModel writes the Hugging Face model and tokenizer files into dir (no trainer state);
// each file is replaced atomically.
func (t *Trainer) SaveModel(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if err := t.writeModelFiles(dir); err != nil {
		return fmt.Errorf("train: save model %s: %w", dir, err)
	}
	return nil
}

// Summary describes the run: model, data and plan.
func (t *Trainer) Summary() string {
	var b strings.Builder
	c := t.Cfg
	a := t.model.Arch
	fmt.Fprintf(&b, "model: %s, %d layers, hidden %d, %d heads (%d kv), vocab %d: %.2fM parameters (%s) on %s\n",
		a.ModelType, a.Layers, a.Hidden, a.Heads, a.KVHeads, a.Vocab, float64(t.model.NumParams())/1e6, t.model.DType(), t.b.Name())
	if t.deviceNote != "" {
		fmt.Fprintf(&b, "device: %s\n", strings.TrimPrefix(t.deviceNote, "; "))
	}
	if l := t.Layout(); l.Parallel {
		fmt.Fprintf(&b, "layout: %s on %s", l.Layout, l.Devices)
		if r, n := t.Node(); n > 1 {
			fmt.Fprintf(&b, " across %d nodes (this is node %d)", n, r)
		}
		b.WriteString("\n")
	}
	st := t.Stats
	fmt.Fprintf(&b, "data: %d documents, %d tokens (%d trained on)", st.Documents, st.Tokens, st.Targets)
	if st.Truncated > 0 {
		fmt.Fprintf(&b, ", %d truncated to max_length %d", st.Truncated, c.Batch.MaxLength)
	}
	if st.Dropped > 0 {
		fmt.Fprintf(&b, ", %d dropped (nothing left to train on)", st.Dropped)
	}
	if t.HasEval() {
		fmt.Fprintf(&b, "; held out: %d documents", t.EvalStats.Documents)
	}
	if s := data.SummarizeBadRows(t.badRows, t.badTotal); s != "" {
		fmt.Fprintf(&b, "\ndata: %s", s)
	}
	fmt.Fprintf(&b, "\nplan: %s, %d steps of %d micro-batches (%d per epoch, packing=%v, %d tokens each), lr %g %s, warmup %d",
		c.Method, t.totalSteps, t.hyper.GradientAccumulationSteps, t.loader.BatchesPerEpoch(), *c.Batch.Packing,
		c.Batch.PerDeviceTrainBatchSize*c.Batch.MaxLength*t.seqsPerDoc(), t.hyper.LearningRate, t.hyper.LRSchedulerType, t.warmup)
	if t.step > 0 {
		fmt.Fprintf(&b, "; resuming after step %d", t.step)
	}
	if n, ok := t.obj.(interface{ note() string }); ok && n.note() != "" {
		fmt.Fprintf(&b, "\n%s", n.note())
	}
	if t.model.IsMoE() {
		bal := "off"
		if r := t.model.ExpertBalancing(); r > 0 {
			bal = fmt.Sprintf("rate %g", r)
		}
		fmt.Fprintf(&b, "\nexperts: %d MoE layers, aux-loss weight %g, aux-loss-free balancing %s", len(t.model.MoELayers()), t.auxCoef, bal)
	}
	return b.String()
}

// progress draws the progress bar: one line redrawn in place on a terminal, plain lines every
// logging_steps otherwise.
type progress struct {
	w     io.Writer
	tty   bool
	total int
	every int
	start time.Time
	drawn bool
	first int
	last  time.Time // when the terminal line was last drawn
}

func newProgress(w io.Writer, tty bool, total, every int) *progress {
	return &progress{w: w, tty: tty, total: total, every: max(1, every), start: time.Now(), first: -1}
}

func (p *progress) update(m StepMetrics) {
	if p.w == nil {
		return
	}
	if p.first < 0 {
		p.first = m.Step - 1
	}
	done := m.Step - p.first
	eta := ""
	if left := p.total - m.Step; left > 0 && done > 0 {
		per := time.Since(p.start) / time.Duration(done)
		eta = " eta " + (per * time.Duration(left)).Round(time.Second).String()
	}
	line := fmt.Sprintf("step %d/%d %s loss %.4f lr %.2e grad %.3f tok/s %.0f%s",
		m.Step, p.total, bar(m.Step, p.total, 20), m.Loss, m.LR, m.GradNorm, m.TokensPerS, eta)
	if m.EvalLoss != nil {
		line += fmt.Sprintf(" eval %.4f", *m.EvalLoss)
	}
	if r, ok := m.Method["reward"]; ok { // GRPO: the loss says little, the reward does
		line += fmt.Sprintf(" reward %.3f", r)
	}
	if m.Method["skipped"] == 1 {
		line += " (skipped: no rewards)"
	}
	if p.tty {
		// Redraw at most ten times a second, but always the last step and eval results.
		if time.Since(p.last) >= 100*time.Millisecond || m.Step >= p.total || m.EvalLoss != nil {
			fmt.Fprintf(p.w, "\r\x1b[K%s", line)
			p.drawn, p.last = true, time.Now()
		}
		return
	}
	if m.Step%p.every == 0 || m.Step == p.total || m.EvalLoss != nil {
		fmt.Fprintln(p.w, line)
	}
}

// finish ends the in-place line so later output starts on a fresh line.
func (p *progress) finish() {
	if p.w != nil && p.tty && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

func bar(done, total, width int) string {
	n := 0
	if total > 0 {
		n = min(width, done*width/total)
	}
	return "[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + "]"
}
