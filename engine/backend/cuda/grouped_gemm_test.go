package cuda

import (
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGroupedWGVariantsMatchTheKernels checks the host's table of warpgroup-MMA variants against
// the kernel file: every GW_KERNELS line of grouped_gemm_wg.cu has a variant with its suffix, its
// tile columns and the shared memory its stages need, and HALO_CUDA_GROUPED_GEMM offers exactly
// those variants besides auto, mma and cublas. A variant added on one side only would launch a kernel
// that does not exist or with too little shared memory.
func TestGroupedWGVariantsMatchTheKernels(t *testing.T) {
	src, err := kernelSource(groupedWGFile)
	if err != nil {
		t.Fatal(err)
	}
	stagesOf := map[string]int{"GW_STAGES": 4}
	lines := regexp.MustCompile(`(?m)^GW_KERNELS\((\w*), (\d+), (\w+), (true|false), (\d)\)`).FindAllStringSubmatch(src, -1)
	if len(lines) == 0 {
		t.Fatal("grouped_gemm_wg.cu defines no GW_KERNELS variants")
	}
	seen := map[string]bool{}
	for _, l := range lines {
		suffix := l[1]
		cols, _ := strconv.Atoi(l[2])
		stages, ok := stagesOf[l[3]]
		if !ok {
			stages, _ = strconv.Atoi(l[3])
		}
		var name string
		for n, v := range groupedWGVariants {
			if v.suffix == suffix {
				name = n
			}
		}
		if name == "" {
			t.Errorf("kernel variant %q (GW_KERNELS line %q) has no entry in groupedWGVariants", suffix, l[0])
			continue
		}
		seen[name] = true
		v := groupedWGVariants[name]
		if v.cols != cols {
			t.Errorf("variant %s: host tiles of %d columns, kernels of %d", name, v.cols, cols)
		}
		if want := wgShared(stages, cols); v.shared != want {
			t.Errorf("variant %s: host gives %d bytes of shared memory, the kernels' %d stages need %d", name, v.shared, stages, want)
		}
	}
	// The TMA variant's kernels are GW_TMA_KERNEL lines, 256 columns in GW_TMA_STAGES stages.
	for n, v := range groupedWGVariants {
		if !v.tma {
			continue
		}
		for _, k := range groupedWGKernels {
			if !regexp.MustCompile(`(?m)^GW_TMA_KERNEL\(` + k + v.suffix + `, \d\)`).MatchString(src) {
				t.Errorf("variant %s: grouped_gemm_wg.cu has no GW_TMA_KERNEL line for %s%s", n, k, v.suffix)
			}
		}
		m := regexp.MustCompile(`(?m)^#define GW_TMA_STAGES (\d+)`).FindStringSubmatch(src)
		if m == nil {
			t.Fatal("grouped_gemm_wg.cu does not define GW_TMA_STAGES")
		}
		stages, _ := strconv.Atoi(m[1])
		if want := wgShared(stages, 256); v.cols != 256 || v.shared != want {
			t.Errorf("variant %s: host tiles of %d columns and %d bytes; the kernels use 256 columns in %d stages, %d bytes", n, v.cols, v.shared, stages, want)
		}
		seen[n] = true
	}
	// A persistent variant's forward and input grad are GW_KERNEL lines of 128 columns, its
	// weight gradient grouped_gemm_wg_dw_SUFFIX running gw_dw_persist<stages>.
	for n, v := range groupedWGVariants {
		if v.ctas == 0 {
			continue
		}
		for _, k := range []string{"fwd", "dx"} {
			m := regexp.MustCompile(`(?m)^GW_KERNEL\(` + k + `, ` + v.suffix + `, (\d+), (\d+), (true|false), (\d)\)`).FindStringSubmatch(src)
			if m == nil {
				t.Errorf("variant %s: grouped_gemm_wg.cu has no GW_KERNEL line for %s%s", n, k, v.suffix)
				continue
			}
			cols, _ := strconv.Atoi(m[1])
			stages, _ := strconv.Atoi(m[2])
			if want := wgShared(stages, cols); v.cols != cols || v.shared != want {
				t.Errorf("variant %s %s: host tiles of %d columns and %d bytes; the kernel's %d columns in %d stages need %d", n, k, v.cols, v.shared, cols, stages, want)
			}
		}
		m := regexp.MustCompile(`(?m)^GW_DW_PERSIST\(` + v.suffix + `, (\d+), (\d+), (\d+)\)`).FindStringSubmatch(src)
		if m == nil {
			t.Errorf("variant %s: grouped_gemm_wg.cu has no GW_DW_PERSIST line for %s", n, v.suffix)
		} else {
			cols, _ := strconv.Atoi(m[1])
			stages, _ := strconv.Atoi(m[2])
			ctas, _ := strconv.Atoi(m[3])
			if v.cols != cols || v.shared != wgShared(stages, cols) || v.ctas != ctas {
				t.Errorf("variant %s: host tiles of %d columns, %d bytes, %d CTAs a multiprocessor; the persistent weight gradient has %d columns in %d stages (%d bytes), %d CTAs", n, v.cols, v.shared, v.ctas, cols, stages, wgShared(stages, cols), ctas)
			}
		}
		seen[n] = true
	}
	var values []string
	for n := range groupedWGVariants {
		if !seen[n] {
			t.Errorf("variant %s has no GW_KERNELS line in grouped_gemm_wg.cu", n)
		}
		values = append(values, n)
	}
	want := append([]string{"auto", "mma", groupedCublas}, values...)
	slices.Sort(want)
	got := slices.Clone(swGrouped.Values)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("HALO_CUDA_GROUPED_GEMM accepts %v; want auto, mma and the variants: %v", swGrouped.Values, want)
	}
}

// TestGroupedWGAutoNamesVariants: every kind's default variant exists.
func TestGroupedWGAutoNamesVariants(t *testing.T) {
	for kind, name := range groupedWGAuto {
		if _, ok := groupedWGVariants[name]; !ok {
			t.Errorf("groupedWGAuto[%s] = %q is not a variant", backend.GroupedKind(kind), name)
		}
	}
}

// TestGroupedGridFollowsTheTile checks the launch grid for both tile widths: the column tiles
// (x) are ceil(columns / width), the row tiles 128 rows each.
func TestGroupedGridFollowsTheTile(t *testing.T) {
	d := backend.GroupedDims{G: 8, S: 1000, N: 1536, K: 2048}
	cases := []struct {
		kind backend.GroupedKind
		cols int
		want [3]uint32
	}{
		{backend.GroupedForward, 128, [3]uint32{12, 8 + 8, 1}},
		{backend.GroupedForward, 256, [3]uint32{6, 8 + 8, 1}},
		{backend.GroupedInputGrad, 256, [3]uint32{8, 8 + 8, 1}},
		{backend.GroupedWeightGrad, 128, [3]uint32{16, 12, 8}},
		{backend.GroupedWeightGrad, 256, [3]uint32{8, 12, 8}},
	}
	for _, c := range cases {
		got, err := groupedGrid(c.kind, d, c.cols)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s with %d-column tiles: grid %v, want %v", c.kind, c.cols, got, c.want)
		}
	}
	if _, err := groupedGrid(backend.GroupedWeightGrad, backend.GroupedDims{G: 70000, S: 1, N: 8, K: 8}, 128); err == nil {
		t.Error("a weight gradient of 70000 groups fits a launch grid; want the 65535 limit named")
	}
}

// TestGroupedTMAMaps checks the tensor maps of each kind against the boxes gw_tma_body copies:
// sizes innermost first, byte strides of bf16 rows, 64-element inner boxes, and the weights as
// one 3-D map per call so that no box reaches another expert's rows.
func TestGroupedTMAMaps(t *testing.T) {
	d := backend.GroupedDims{G: 128, S: 65536, N: 1536, K: 2048}
	cases := []struct {
		kind backend.GroupedKind
		a, b tmaSpec
	}{
		{backend.GroupedForward,
			tmaSpec{rank: 2, dims: [3]uint64{2048, 65536}, strides: [2]uint64{4096}, box: [3]uint32{64, 128}},
			tmaSpec{rank: 3, dims: [3]uint64{2048, 1536, 128}, strides: [2]uint64{4096, 1536 * 4096}, box: [3]uint32{64, 256, 1}}},
		{backend.GroupedInputGrad,
			tmaSpec{rank: 2, dims: [3]uint64{1536, 65536}, strides: [2]uint64{3072}, box: [3]uint32{64, 128}},
			tmaSpec{rank: 3, dims: [3]uint64{2048, 1536, 128}, strides: [2]uint64{4096, 1536 * 4096}, box: [3]uint32{64, 64, 1}}},
		{backend.GroupedWeightGrad,
			tmaSpec{rank: 2, dims: [3]uint64{1536, 65536}, strides: [2]uint64{3072}, box: [3]uint32{64, 64}},
			tmaSpec{rank: 2, dims: [3]uint64{2048, 65536}, strides: [2]uint64{4096}, box: [3]uint32{64, 64}}},
	}
	for _, c := range cases {
		a, b := groupedTMAMaps(c.kind, d)
		if a != c.a || b != c.b {
			t.Errorf("%s: maps\n A %+v\n B %+v\nwant\n A %+v\n B %+v", c.kind, a, b, c.a, c.b)
		}
		for _, m := range []tmaSpec{a, b} {
			for i := 0; i < m.rank-1; i++ {
				if m.strides[i]%16 != 0 {
					t.Errorf("%s: stride %d of %+v is not a multiple of 16 bytes", c.kind, m.strides[i], m)
				}
			}
		}
	}
}

// TestTensorMapIsAligned checks that a tensor map's 128 bytes start on a 64-byte boundary and lie
// inside its array, wherever Go places the array.
func TestTensorMapIsAligned(t *testing.T) {
	for range 64 {
		m := new(tensorMap)
		p, base := uintptr(m.ptr()), uintptr(unsafe.Pointer(&m.raw[0]))
		if p%64 != 0 || p < base || p+128 > base+uintptr(len(m.raw))*8 {
			t.Fatalf("tensor map at %#x (array %#x, %d bytes): want 64-byte aligned, 128 bytes inside", p, base, len(m.raw)*8)
		}
	}
}

// TestGroupedWGKernelsAreDefined preprocesses grouped_gemm_wg.cu (clang -E, as NVRTC's
// preprocessor would expand its macros) and checks that every kind of every variant the host
// launches is defined there under the name the host asks for. Skipped without clang.
func TestGroupedWGKernelsAreDefined(t *testing.T) {
	clang, ok := clangForCUDA()
	if !ok {
		t.Skip("needs clang to preprocess the kernel file")
	}
	src, err := kernelSource(groupedWGFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(clang, "-E", "-P", "-x", "c++", "-")
	cmd.Stdin = strings.NewReader(src)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("clang -E: %v", err)
	}
	for name, v := range groupedWGVariants {
		for _, k := range groupedWGKernels {
			if !regexp.MustCompile(`__global__[^;{]*\b` + k + v.suffix + `\(`).Match(out) {
				t.Errorf("variant %s: the kernel file defines no %s%s", name, k, v.suffix)
			}
		}
	}
}

// TestEncodeTMAWithoutTheEntryPoint: a driver without cuTensorMapEncodeTiled refuses the TMA
// variant with an error that names the entry point and the variant to use instead.
func TestEncodeTMAWithoutTheEntryPoint(t *testing.T) {
	var d driverAPI
	a, _ := groupedTMAMaps(backend.GroupedForward, backend.GroupedDims{G: 2, S: 64, N: 128, K: 64})
	_, err := d.encodeTMA(a, 0)
	if err == nil || !strings.Contains(err.Error(), "cuTensorMapEncodeTiled") || !strings.Contains(err.Error(), "HALO_CUDA_GROUPED_GEMM=wg") {
		t.Fatalf("got %v, want a refusal naming cuTensorMapEncodeTiled and HALO_CUDA_GROUPED_GEMM=wg", err)
	}
}

// TestPersistentGrid: a persistent weight gradient launches one CTA a tile up to its CTAs a
// multiprocessor, and at least one.
func TestPersistentGrid(t *testing.T) {
	for _, tc := range []struct {
		grid      [3]uint32
		sms, ctas int
		want      uint32
	}{
		{[3]uint32{16, 12, 128}, 132, 2, 264}, // Qwen3-30B-A3B gate-up: 24576 tiles
		{[3]uint32{8, 12, 128}, 132, 1, 132},  // the same in 256-column tiles, one CTA each
		{[3]uint32{2, 1, 3}, 132, 2, 6},       // fewer tiles than CTAs
		{[3]uint32{1, 1, 1}, 0, 2, 1},         // no multiprocessor count known
		{[3]uint32{65535, 65535, 2}, 8, 2, 16},
	} {
		if got := persistentGrid(tc.grid, tc.sms, tc.ctas); got != [3]uint32{tc.want, 1, 1} {
			t.Errorf("persistentGrid(%v, %d, %d) = %v, want [%d 1 1]", tc.grid, tc.sms, tc.ctas, got, tc.want)
		}
	}
}

// TestCheckGroupOffsets: the per-group cuBLASLt path refuses offsets that do not rise from 0
// to S over G+1 entries, naming what is wrong.
func TestCheckGroupOffsets(t *testing.T) {
	for _, tc := range []struct {
		offs []int32
		g, s int
		bad  string
	}{
		{[]int32{0, 3, 3, 7}, 3, 7, ""},
		{[]int32{0, 0}, 1, 0, ""},
		{[]int32{0, 3, 7}, 3, 7, "3 offsets for 3 groups"},
		{[]int32{1, 3, 7}, 2, 7, "run from 1 to 7"},
		{[]int32{0, 3, 6}, 2, 7, "run from 0 to 6"},
		{[]int32{0, 5, 3, 7}, 3, 7, "must not decrease"},
	} {
		err := checkGroupOffsets(tc.offs, tc.g, tc.s)
		if tc.bad == "" && err != nil || tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("checkGroupOffsets(%v, %d, %d) = %v, want %q", tc.offs, tc.g, tc.s, err, tc.bad)
		}
	}
}

// The tensor-core kernels take only bf16 operands with rows on 16-byte boundaries, and an
// output that starts on one: a gradient view 2 bytes off (an arena packed around a one-element
// parameter) faulted with a misaligned address before the output was checked.
func TestGroupedMMANeedsAlignedOperandsAndOutput(t *testing.T) {
	bf, f32 := int32(tensor.BF16), int32(tensor.F32)
	d := backend.GroupedDims{G: 4, S: 64, N: 128, K: 64}
	for _, c := range []struct {
		name       string
		d          backend.GroupedDims
		ca, cb     int32
		pa, pb, po uintptr
		want       bool
	}{
		{"aligned", d, bf, bf, 4096, 8192, 16384, true},
		{"output 2 bytes off", d, bf, bf, 4096, 8192, 16386, false},
		{"output 8 bytes off", d, bf, bf, 4096, 8192, 16392, false},
		{"A 2 bytes off", d, bf, bf, 4098, 8192, 16384, false},
		{"B 4 bytes off", d, bf, bf, 4096, 8196, 16384, false},
		{"f32 operand", d, f32, bf, 4096, 8192, 16384, false},
		{"N not a multiple of 8", backend.GroupedDims{G: 4, S: 64, N: 100, K: 64}, bf, bf, 4096, 8192, 16384, false},
		{"K not a multiple of 8", backend.GroupedDims{G: 4, S: 64, N: 128, K: 60}, bf, bf, 4096, 8192, 16384, false},
	} {
		if got := groupedMMA(c.d, c.ca, c.cb, c.pa, c.pb, c.po); got != c.want {
			t.Errorf("%s: groupedMMA = %v, want %v", c.name, got, c.want)
		}
	}
}
