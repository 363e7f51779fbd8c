package train

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Checkpoint files written next to the Hugging Face model files.
const (
	// StateFile holds the trainer state as JSON.
	StateFile = "trainer_state.json"
	// OptimizerFile holds the optimizer moments (and fp32 master weights) as flat tensors.
	OptimizerFile = "optimizer.safetensors"
	stateFormat   = 1
)

// tokenizerFiles are copied from the tokenizer directory into every checkpoint.
var tokenizerFiles = []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json"}

// trainerState is what a checkpoint adds to the model to resume exactly.
type trainerState struct {
	Format int `json:"format"`
	// Step is the number of optimizer steps done.
	Step int `json:"step"`
	// OptimizerSteps is AdamW's update count (bias correction).
	OptimizerSteps int `json:"optimizer_steps"`
	// Cursor is the data position of the next micro-batch.
	Cursor data.Cursor `json:"cursor"`
	// Seed drives shuffling and stochastic rounding; every random choice derives from it and
	// the step, so it is the whole RNG state.
	Seed int64 `json:"seed"`
	// TotalSteps and Warmup fix the schedule.
	TotalSteps int `json:"total_steps"`
	Warmup     int `json:"warmup_steps"`
	// Hyper are the hyperparameters in force (they may differ from Config after SetHyper).
	Hyper Hyper `json:"hyper"`
	// Data fixes the micro-batch plan; resuming with other values would not be exact.
	Data stateData `json:"data"`
	// Params lists the parameter names and sizes, to refuse another model.
	Params []stateParam `json:"params"`
	// Config is the run's configuration, for reference.
	Config *Config `json:"config"`
	// ExpertBias is the aux-loss-free balancing bias of each MoE layer, in layer order (absent
	// when balancing is off). It is restored when the resumed run balances too.
	ExpertBias [][]float32 `json:"expert_bias,omitempty"`
	// WeightsOnly marks a checkpoint written by earlier builds for a run across nodes: it
	// has the weights but no optimizer state, and cannot be resumed. Checkpoints are no
	// longer written so.
	WeightsOnly bool `json:"weights_only,omitempty"`
	// LoRADropoutKey is the adapters' dropout stream position (models.Model.DropoutKey) of a
	// run with use_peft, whose checkpoints hold the adapter instead of the model.
	LoRADropoutKey uint64 `json:"lora_dropout_key,omitempty"`
}

type stateData struct {
	MaxLength       int  `json:"max_length"`
	Packing         bool `json:"packing"`
	BatchSize       int  `json:"per_device_train_batch_size"`
	BatchesPerEpoch int  `json:"batches_per_epoch"`
	Documents       int  `json:"documents"`
	Tokens          int  `json:"tokens"`
}

type stateParam struct {
	Name  string `json:"name"`
	Numel int    `json:"numel"`
}

func (t *Trainer) state() trainerState {
	st := trainerState{
		Format: stateFormat, Step: t.step, OptimizerSteps: t.opt.Steps(), Cursor: t.loader.Cursor(),
		Seed: *t.Cfg.Run.Seed, TotalSteps: t.totalSteps, Warmup: t.warmup, Hyper: t.hyper, Config: t.Cfg,
		Data: stateData{MaxLength: t.Cfg.Batch.MaxLength, Packing: *t.Cfg.Batch.Packing,
			BatchSize: t.Cfg.Batch.PerDeviceTrainBatchSize, BatchesPerEpoch: t.loader.BatchesPerEpoch(),
			Documents: t.Stats.Documents, Tokens: t.Stats.Tokens},
	}
	specs := t.model.Specs
	if ad := t.model.LoRA(); ad != nil {
		specs = ad.Specs // what trains, and what the checkpoint holds
		st.LoRADropoutKey = t.model.DropoutKey()
	}
	for _, s := range specs {
		st.Params = append(st.Params, stateParam{s.Name, s.Numel()})
	}
	st.ExpertBias = t.ExpertBias()
	return st
}

// Save writes a checkpoint to dir: the Hugging Face model (config.json, model.safetensors; with
// use_peft the adapter in PEFT's format instead), the
// tokenizer files, and the trainer state (optimizer moments, data cursor, step, schedule,
// configuration). Everything is written into a temporary directory beside dir that is renamed
// into place, so dir holds either the previous checkpoint or the complete new one.
//
// In a run across nodes Save is a collective: every node must call it, between the same
// steps. The optimizer shards are gathered from every node, and only node 0 writes dir.
func (t *Trainer) Save(dir string) (err error) {
	// Gather a plan's parameters into the single model when a step changed them, and its
	// optimizer state into the layout-free form the checkpoint stores.
	if err := t.exec.syncState(); err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	if !t.lead() {
		return nil
	}
	dir = filepath.Clean(dir)
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("train: save: %w", err)
	}
	if err := cleanStale(parent, filepath.Base(dir)); err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("train: save: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("train: save: %w", err)
	}
	if err := t.writeModelFiles(tmp); err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	_, sts, err := t.opt.Export()
	if err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	opt := make([]safetensors.Tensor, len(sts))
	for i, st := range sts {
		sdt, err := stDType(st.DType)
		if err != nil {
			return err
		}
		opt[i] = safetensors.Tensor{Name: st.Name, DType: sdt, Shape: st.Shape, Data: st.Data}
	}
	if err := safetensors.Save(filepath.Join(tmp, OptimizerFile), opt, map[string]string{"format": "halo-shell"}); err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	js, err := json.MarshalIndent(t.state(), "", "  ")
	if err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, StateFile), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	// Every file and the directory reach the disk before the rename makes them the
	// checkpoint, so that a crash never leaves dir with missing or short files.
	if err := syncTree(tmp); err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	// Swap: move an old checkpoint aside, move the new one in, then delete the old one.
	old := ""
	if _, err := os.Stat(dir); err == nil {
		old = tmp + oldSuffix
		if err := os.Rename(dir, old); err != nil {
			return fmt.Errorf("train: save %s: %w", dir, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			_ = os.Rename(old, dir)
		}
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	if err := syncDir(parent); err != nil {
		return fmt.Errorf("train: save %s: %w", dir, err)
	}
	if old != "" {
		_ = os.RemoveAll(old)
	}
	return nil
}

// A checkpoint directory D is written as .D.tmp-XXXX beside it and renamed into place; the
// previous D is moved to .D.tmp-XXXX.old while the new one takes its name, and a step
// checkpoint past save_total_limit is renamed .D.tmp-rm-XXXX before it is deleted. So D is
// always either complete or absent, and what a crash leaves is hidden under those names.
const (
	tmpInfix  = ".tmp-"
	oldSuffix = ".old"
)

// cleanStale removes what an interrupted save or rotation left in parent: the hidden
// .NAME.tmp-* directories of the checkpoint NAME, or of every checkpoint-N (and a metrics
// log being rewritten) when name is "".
// A previous checkpoint that a crash left moved aside (.NAME.tmp-XXXX.old while NAME is
// missing) is moved back instead.
func cleanStale(parent, name string) error {
	ents, err := os.ReadDir(parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		n := e.Name()
		base, _, ok := strings.Cut(strings.TrimPrefix(n, "."), tmpInfix)
		if !ok || !strings.HasPrefix(n, ".") {
			continue
		}
		if name == "" && base == MetricsFile && e.Type().IsRegular() {
			// A metrics log that trimMetrics was rewriting.
			if err := os.Remove(filepath.Join(parent, n)); err != nil {
				return err
			}
			continue
		}
		if !e.IsDir() {
			continue
		}
		if name != "" && base != name || name == "" && !strings.HasPrefix(base, "checkpoint-") {
			continue
		}
		path := filepath.Join(parent, n)
		if strings.HasSuffix(n, oldSuffix) {
			if _, err := os.Stat(filepath.Join(parent, base)); errors.Is(err, os.ErrNotExist) {
				if err := os.Rename(path, filepath.Join(parent, base)); err != nil {
					return err
				}
				continue
			}
		}
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("removing what an interrupted save left: %w", err)
		}
	}
	return syncDir(parent)
}

// removeCheckpoint deletes a checkpoint directory so that a crash part way leaves nothing
// under its name: it is moved into a hidden .NAME.tmp-rm-* directory first (and that rename
// made durable), then deleted.
func removeCheckpoint(dir string) error {
	parent := filepath.Dir(dir)
	hidden, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+tmpInfix+"rm-")
	if err != nil {
		return err
	}
	// Move it into the directory just made, whose unique name is reserved.
	if err := os.Rename(dir, filepath.Join(hidden, filepath.Base(dir))); err != nil {
		os.Remove(hidden)
		return err
	}
	if err := syncDir(parent); err != nil {
		return err
	}
	return removeTree(hidden)
}

// removeTree is os.RemoveAll; tests stop it part way, as a kill would.
var removeTree = os.RemoveAll

// syncTree flushes every regular file under root and every directory, root last.
func syncTree(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		serr := f.Sync()
		if cerr := f.Close(); serr == nil {
			serr = cerr
		}
		return serr
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syncDir(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// syncDir flushes a directory's entries (the names created, renamed or removed in it).
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func stDType(dt tensor.DType) (safetensors.DType, error) {
	switch dt {
	case tensor.F32:
		return safetensors.F32, nil
	case tensor.BF16:
		return safetensors.BF16, nil
	}
	return 0, fmt.Errorf("train: optimizer state of dtype %s cannot be saved", dt)
}

func tensorDType(dt safetensors.DType) (tensor.DType, error) {
	switch dt {
	case safetensors.F32:
		return tensor.F32, nil
	case safetensors.BF16:
		return tensor.BF16, nil
	}
	return 0, fmt.Errorf("dtype %s is not an optimizer state dtype", dt)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Resume loads a checkpoint written by Save into this trainer: weights, optimizer state, step,
// hyperparameters and data cursor. The trainer must have been built for the same model shape
// and the same data plan (max_length, packing, batch size, dataset); anything else is refused
// with the value that differs. On the CPU, steps after Resume reproduce the uninterrupted run's
// losses bit for bit. When Resume fails after the checks, the trainer may hold part of the
// checkpoint's state: close it and build a new one.
func (t *Trainer) Resume(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return fmt.Errorf("train: resume: %w (is %s a checkpoint written by halo-shell?)", err, dir)
	}
	var st trainerState
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("train: resume: %s: %v", filepath.Join(dir, StateFile), err)
	}
	if st.Format != stateFormat {
		return fmt.Errorf("train: resume: %s: format %d, this build reads %d", dir, st.Format, stateFormat)
	}
	if st.WeightsOnly {
		return fmt.Errorf("train: resume: %s: %w", dir, errWeightsOnly)
	}
	if t.onPlan() != nil {
		if err := t.refuseNodes("resuming a checkpoint into a running trainer"); err != nil {
			return err
		}
	}
	cur := t.state()
	if !slices.Equal(st.Params, cur.Params) {
		return fmt.Errorf("train: resume: %s holds a model with other parameters than the configured one", dir)
	}
	if st.Data != cur.Data {
		return fmt.Errorf("train: resume: %s was made with another data plan (checkpoint %+v, now %+v): resume with the same dataset, max_length, packing and per_device_train_batch_size", dir, st.Data, cur.Data)
	}
	if st.Seed != cur.Seed {
		return fmt.Errorf("train: resume: %s was made with seed %d, the config says %d", dir, st.Seed, cur.Seed)
	}
	if err := st.Hyper.validate(); err != nil {
		return fmt.Errorf("train: resume: %s: %w", dir, err)
	}
	if oc := t.opt.Config(); st.Hyper.AdamBeta1 != oc.Beta1 || st.Hyper.AdamBeta2 != oc.Beta2 || st.Hyper.AdamEpsilon != oc.Eps {
		return fmt.Errorf("train: resume: %s was trained with adam_beta1 %v, adam_beta2 %v, adam_epsilon %v; the config says %v, %v, %v: use the checkpoint's values",
			dir, st.Hyper.AdamBeta1, st.Hyper.AdamBeta2, st.Hyper.AdamEpsilon, oc.Beta1, oc.Beta2, oc.Eps)
	}
	f, err := safetensors.Open(filepath.Join(dir, OptimizerFile))
	if err != nil {
		return fmt.Errorf("train: resume: %w", err)
	}
	defer f.Close()
	var sts []optim.StateTensor
	for _, name := range f.Names() {
		info, _ := f.Tensor(name)
		dt, err := tensorDType(info.DType)
		if err != nil {
			return fmt.Errorf("train: resume: %s: tensor %q: %w", f.Path(), name, err)
		}
		sts = append(sts, optim.StateTensor{Name: name, DType: dt, Shape: info.Shape, Data: info.Data})
	}
	if err := t.opt.Import(st.OptimizerSteps, sts); err != nil {
		return fmt.Errorf("train: resume: %s: %w", f.Path(), err)
	}
	if err := loadModelWeights(t.model, dir); err != nil {
		return fmt.Errorf("train: resume: %w", err)
	}
	t.model.SetDropoutKey(st.LoRADropoutKey)
	if st.ExpertBias != nil && t.model.ExpertBalancing() > 0 {
		if err := t.model.SetExpertBias(st.ExpertBias); err != nil {
			return fmt.Errorf("train: resume: %s: expert_bias: %w", filepath.Join(dir, StateFile), err)
		}
	}
	if err := t.loader.Seek(st.Cursor); err != nil {
		return fmt.Errorf("train: resume: %w", err)
	}
	t.step, t.hyper = st.Step, st.Hyper
	t.totalSteps, t.warmup = st.TotalSteps, st.Warmup
	if t.Cfg.Sched.MaxSteps > 0 && t.Cfg.Sched.MaxSteps != st.TotalSteps {
		// A longer or shorter run was asked for: keep the warmup, stretch the schedule.
		t.totalSteps = t.Cfg.Sched.MaxSteps
	}
	if ps := t.onPlan(); ps != nil {
		// The single model now holds the run's parameters: lay them out again over the
		// run's devices.
		l, d := ps.p.Mesh.Layout, ps.devices
		err := ps.close()
		t.exec = t.deviceStepper()
		if err != nil {
			return fmt.Errorf("train: resume: releasing the old plan: %w", err)
		}
		if err := t.startPlan(d, l); err != nil {
			return fmt.Errorf("train: resume: %w", err)
		}
	}
	return nil
}

// stepDirs lists output_dir/checkpoint-N directories, oldest first.
func stepDirs(out string) ([]string, error) {
	ents, err := os.ReadDir(out)
	if err != nil {
		return nil, err
	}
	type cd struct {
		n    int
		path string
	}
	var ds []cd
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "checkpoint-") {
			continue
		}
		n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "checkpoint-"))
		if err != nil {
			continue
		}
		ds = append(ds, cd{n, filepath.Join(out, e.Name())})
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].n < ds[j].n })
	paths := make([]string, len(ds))
	for i, d := range ds {
		paths[i] = d.path
	}
	return paths, nil
}

// SaveStep writes output_dir/checkpoint-<step> and removes the oldest step checkpoints beyond
// save_total_limit. It returns the checkpoint's path. In a run across nodes it is a
// collective like Save; only node 0 writes and removes checkpoints.
func (t *Trainer) SaveStep() (string, error) {
	dir := filepath.Join(t.Cfg.Run.OutputDir, fmt.Sprintf("checkpoint-%d", t.step))
	if err := t.Save(dir); err != nil {
		return "", err
	}
	if !t.lead() {
		return dir, nil
	}
	if lim := t.Cfg.Run.SaveTotalLimit; lim > 0 {
		ds, err := stepDirs(t.Cfg.Run.OutputDir)
		if err != nil {
			return dir, err
		}
		for len(ds) > lim {
			if err := removeCheckpoint(ds[0]); err != nil {
				return dir, fmt.Errorf("train: save_total_limit: %w", err)
			}
			ds = ds[1:]
		}
	}
	return dir, nil
}

// writeModelFiles writes the Hugging Face model and the tokenizer files the run was given into
// dir (a tokenizer file the run does not have is skipped).
func (t *Trainer) writeModelFiles(dir string) error {
	if err := t.exec.syncParams(); err != nil {
		return err
	}
	if err := saveModel(t.model, dir, adapterBase(t.Cfg)); err != nil {
		return err
	}
	for _, name := range tokenizerFiles {
		if err := copyFile(filepath.Join(t.tok.dir, name), filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// trimMetrics keeps the rows of the metrics log at path up to step (and drops a torn last
// line), so that a run resumed from a checkpoint at step does not log again, after the rows
// it already has, the steps that the interrupted run did past that checkpoint. The log is
// streamed into a temporary file beside it that replaces it; a missing log is no error.
func trimMetrics(path string, step int) (err error) {
	in, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+tmpInfix)
	if err != nil {
		return err
	}
	defer func() {
		if out != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	r := bufio.NewReaderSize(in, 1<<16)
	w := bufio.NewWriterSize(out, 1<<16)
	dropped := 0
	for {
		line, rerr := r.ReadBytes('\n')
		if len(line) > 0 {
			var row struct {
				Step *int `json:"step"`
			}
			if line[len(line)-1] == '\n' && json.Unmarshal(line, &row) == nil && row.Step != nil && *row.Step <= step {
				if _, err := w.Write(line); err != nil {
					return err
				}
			} else {
				dropped++
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if dropped == 0 {
		return nil
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	name := out.Name()
	out = nil
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return err
	}
	return syncDir(filepath.Dir(path))
}
