package models

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// decoders are the two GenerateBatch implementations (HALO_GENERATE values); the CPU backend
// has both, so every generation test runs through each.
var decoders = []string{"host", "device"}

// useDecoder selects dec for the rest of the test, skipping the device decoder on a model that
// cannot use it (latent attention, short convolutions).
func useDecoder(t *testing.T, m *Model, dec string) {
	t.Helper()
	if dec == "device" && m.Arch.Latent.KVRank > 0 {
		t.Skip("latent attention decodes through the host decoder")
	}
	if dec == "device" && slices.Contains(m.Arch.Conv.Layers, true) {
		t.Setenv("HALO_GENERATE", dec)
		if _, err := m.deviceDecoding(); err == nil || !strings.Contains(err.Error(), "short-convolution") {
			t.Fatalf("HALO_GENERATE=device on short-convolution layers: got %v, want a refusal naming them", err)
		}
		t.Skip("short-convolution layers decode through the host decoder")
	}
	t.Setenv("HALO_GENERATE", dec)
	got, err := m.deviceDecoding()
	if err != nil {
		t.Fatal(err)
	}
	if got != (dec == "device") {
		t.Fatalf("HALO_GENERATE=%s: device decoding is %v", dec, got)
	}
}

// TestDeviceDecoderChoice: auto keeps the CPU backend on the host decoder, device is refused
// with the reason where it cannot work, and a bad value is named.
func TestDeviceDecoderChoice(t *testing.T) {
	m := newTiny(t, newCPU(), familyCases[0].arch, Options{}, 2)
	for _, tc := range []struct {
		mode, want string
		dev        bool
	}{
		{"auto", "", false}, {"host", "", false}, {"device", "", true}, {"gpu", "HALO_GENERATE", false},
	} {
		t.Setenv("HALO_GENERATE", tc.mode)
		dev, err := m.deviceDecoding()
		if tc.want != "" {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("HALO_GENERATE=%s: error %v, want one naming %q", tc.mode, err, tc.want)
			}
			continue
		}
		if err != nil || dev != tc.dev {
			t.Errorf("HALO_GENERATE=%s: device %v, error %v; want %v", tc.mode, dev, err, tc.dev)
		}
	}
	bare := newTiny(t, noDecodeOps{cpu.New(cpu.Options{})}, familyCases[0].arch, Options{}, 2)
	t.Setenv("HALO_GENERATE", "device")
	if _, err := bare.deviceDecoding(); err == nil || !strings.Contains(err.Error(), "DecodeAttention") {
		t.Errorf("device decoding on a backend without the ops: error %v, want one naming DecodeAttention", err)
	}
	t.Setenv("HALO_GENERATE", "auto")
	if dev, err := bare.deviceDecoding(); err != nil || dev {
		t.Errorf("auto on a backend without the ops: device %v, error %v; want the host decoder", dev, err)
	}
}

// noDecodeOps is a backend without the decoding ops.
type noDecodeOps struct{ backend.Backend }

func (b noDecodeOps) Optional() backend.Optional {
	o := b.Backend.Optional()
	o.DecodeAttention, o.SampleTokens = nil, nil
	return o
}

// TestDeviceDecoderMatchesHost: at temperature 0 with stop ids the device decoder equals the
// host decoder token for token, whatever the read interval, for GQA with a sliding window,
// attention sinks and soft-capped logits; sampled rows are the same for every read interval.
func TestDeviceDecoderMatchesHost(t *testing.T) {
	for _, tc := range familyCases {
		if !slices.Contains([]string{"mistral_window", "mistral_sinks_window", "gemma3_all_features", "qwen3_qknorm_headdim", "gpt_oss_experts"}, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			m := newTiny(t, newCPU(), tc.arch, Options{}, 31)
			const n = 11
			greedy := BatchGenerateOptions{GenerateOptions: GenerateOptions{MaxNewTokens: n}}
			t.Setenv("HALO_GENERATE", "host")
			want, err := m.GenerateBatch(batchPrompts, greedy)
			if err != nil {
				t.Fatal(err)
			}
			greedy.StopIDs = []int32{want[0][3], want[2][6]}
			wantStop, err := m.GenerateBatch(batchPrompts, greedy)
			if err != nil {
				t.Fatal(err)
			}
			sampled := BatchGenerateOptions{GenerateOptions: GenerateOptions{MaxNewTokens: n, Temperature: 0.9, TopK: 9, TopP: 0.9, Seed: 4, StopIDs: greedy.StopIDs}}
			var firstSampled [][]int32
			t.Setenv("HALO_GENERATE", "device")
			for _, every := range []string{"1", "3", "8", "256"} {
				t.Setenv("HALO_GENERATE_CHECK_EVERY", every)
				greedy.StopIDs = nil
				got, err := m.GenerateBatch(batchPrompts, greedy)
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("read every %s: device greedy %v, host %v", every, got, want)
				}
				greedy.StopIDs = sampled.StopIDs
				var streamed [4][]int32
				greedy.OnRowToken = func(r int, id int32) error { streamed[r] = append(streamed[r], id); return nil }
				got, err = m.GenerateBatch(batchPrompts, greedy)
				greedy.OnRowToken = nil
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(got) != fmt.Sprint(wantStop) {
					t.Errorf("read every %s, stop %v: device greedy %v, host %v", every, greedy.StopIDs, got, wantStop)
				}
				if fmt.Sprint(streamed[:]) != fmt.Sprint(got) {
					t.Errorf("read every %s: streamed %v, returned %v", every, streamed, got)
				}
				s, err := m.GenerateBatch(batchPrompts, sampled)
				if err != nil {
					t.Fatal(err)
				}
				if firstSampled == nil {
					firstSampled = s
				} else if fmt.Sprint(s) != fmt.Sprint(firstSampled) {
					t.Errorf("read every %s: sampled %v, with another interval %v", every, s, firstSampled)
				}
			}
		})
	}
}

// TestDeviceDecoderReportsNaN: NaN weights are an error naming the row, not garbage tokens.
func TestDeviceDecoderReportsNaN(t *testing.T) {
	m := newTiny(t, newCPU(), familyCases[0].arch, Options{}, 3)
	t.Setenv("HALO_GENERATE", "device")
	w := m.head.W
	vals := make([]float32, w.Numel())
	vals[0] = float32(math.NaN())
	nan, err := backend.FromFloat32(m.b, vals, w.DType(), w.Shape()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.b.Copy(w, nan); err != nil {
		t.Fatal(err)
	}
	_, err = m.GenerateBatch(batchPrompts, BatchGenerateOptions{GenerateOptions: GenerateOptions{MaxNewTokens: 4}})
	if err == nil || !strings.Contains(err.Error(), "NaN logits") {
		t.Fatalf("error %v, want one about NaN logits", err)
	}
}

// TestSampleTokensDistribution draws many samples from the CPU backend's SampleTokens (the
// device sampler's reference), one seed per draw, and checks each token's frequency against the
// warped distribution within 5 standard errors, and that filtered tokens never appear; and that
// temperature 0 is the argmax whatever the filters say.
func TestSampleTokensDistribution(t *testing.T) {
	b := cpu.New(cpu.Options{})
	logits := []float32{2.0, 0.5, 1.0, -1.0, 1.25, 0.0, -3.0}
	lg, err := backend.FromFloat32(b, logits, tensor.F32, 1, len(logits))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := b.Alloc(tensor.I32, 1)
	draw := func(o GenerateOptions, seed uint64) int32 {
		if err := b.Optional().SampleTokens(backend.SampleArgs{Out: out, Logits: lg, Temperature: float32(o.Temperature),
			TopK: o.TopK, TopP: float32(o.TopP), Seed: seed, Step: 3}); err != nil {
			t.Fatal(err)
		}
		ids, err := backend.ToInt32(b, out)
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	if id := draw(GenerateOptions{TopK: 3, TopP: 0.1}, 1); id != 0 {
		t.Errorf("temperature 0 drew %d, want the argmax 0", id)
	}
	for _, o := range []GenerateOptions{
		{Temperature: 1},
		{Temperature: 0.5},
		{Temperature: 2.5},
		{Temperature: 1, TopK: 3},
		{Temperature: 1, TopK: 1},
		{Temperature: 1, TopP: 0.6},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 1.5, TopK: 4, TopP: 0.7},
	} {
		t.Run(fmt.Sprintf("T%v_k%d_p%v", o.Temperature, o.TopK, o.TopP), func(t *testing.T) {
			want := warped(logits, o)
			const draws = 20000
			counts := make([]int, len(logits))
			for i := range draws {
				counts[draw(o, uint64(i))]++
			}
			for j, p := range want {
				f := float64(counts[j]) / draws
				if p == 0 {
					if counts[j] != 0 {
						t.Errorf("token %d is filtered out but was drawn %d times", j, counts[j])
					}
					continue
				}
				se := math.Sqrt(p * (1 - p) / draws)
				if math.Abs(f-p) > 5*se+1e-12 {
					t.Errorf("token %d: frequency %.4f, probability %.4f (5 s.e. = %.4f)", j, f, p, 5*se)
				}
			}
		})
	}
}
