package server

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/train"
)

// Profiling belongs to the session's trainer: NewTrainer wraps that trainer's device, and the
// devices that anything else in the process opens, including a plain train.New, stay plain.
func TestNewTrainerProfilesOnlyItsOwnDevice(t *testing.T) {
	cfg, err := train.LoadConfig(tinyConfig, "sft", []string{"--output_dir=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if recorderOf(tr.Backend()) == nil {
		t.Fatal("the trainer of NewTrainer has no profile recorder")
	}
	if again := Profiled(tr.Backend()); again != tr.Backend() {
		t.Error("Profiled wrapped a profiled device a second time")
	}
	b, err := backend.Open("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, _, ok := profile.Unwrap(b); ok {
		t.Error("backend.Open(\"cpu\") returned a profiled device after NewTrainer: the registry was changed")
	}
	plain, err := train.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if recorderOf(plain.Backend()) != nil {
		t.Error("train.New built a profiled trainer after NewTrainer")
	}
}
