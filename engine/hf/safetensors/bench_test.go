package safetensors

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if benchDir != "" {
		os.RemoveAll(benchDir)
	}
	os.Exit(code)
}

var (
	benchOnce sync.Once
	benchDir  string
	benchErr  error
)

const (
	benchTensors = 32
	benchElems   = 4 << 20 // BF16 elements per tensor: 8 MiB each, 256 MiB in all
)

// benchCheckpoint writes, once per test binary, a 256 MiB BF16 checkpoint in 2 shards.
func benchCheckpoint(b *testing.B) string {
	benchOnce.Do(func() {
		benchDir, benchErr = os.MkdirTemp("", "safetensors-bench-")
		if benchErr != nil {
			return
		}
		rng := rand.New(rand.NewPCG(1, 2))
		tensors := make([]Tensor, benchTensors)
		for i := range tensors {
			data := make([]byte, 2*benchElems)
			for j := 0; j < len(data); j += 8 {
				v := rng.Uint64()
				for k := range 8 {
					data[j+k] = byte(v >> (8 * k))
				}
			}
			tensors[i] = Tensor{Name: fmt.Sprintf("model.layers.%d.mlp.weight", i), DType: BF16, Shape: []int{2048, benchElems / 2048}, Data: data}
		}
		_, benchErr = SaveCheckpoint(benchDir, tensors, CheckpointOptions{MaxShardSize: 128 << 20})
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchDir
}

// BenchmarkLoadBF16 opens a 256 MiB BF16 checkpoint (memory mapped, warm page cache) and
// converts every tensor to float32 with ToFloat32. Throughput is BF16 bytes read per second.
func BenchmarkLoadBF16(b *testing.B) {
	dir := benchCheckpoint(b)
	b.SetBytes(2 * benchTensors * benchElems)
	b.ResetTimer()
	for b.Loop() {
		c, err := OpenCheckpoint(dir)
		if err != nil {
			b.Fatal(err)
		}
		for _, name := range c.Names() {
			ti, _ := c.Tensor(name)
			if _, err := ToFloat32(ti); err != nil {
				b.Fatal(err)
			}
		}
		c.Close()
	}
}

// BenchmarkDecodeBF16 converts an 8 MiB BF16 tensor into a reused float32 buffer: the
// conversion alone, without mapping or allocation.
func BenchmarkDecodeBF16(b *testing.B) {
	src := make([]byte, 2*benchElems)
	dst := make([]float32, benchElems)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		if err := DecodeFloat32(dst, BF16, src); err != nil {
			b.Fatal(err)
		}
	}
}
