package cuda

import (
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// TestGroupedWGVariantsMatchTheKernels checks the host's table of warpgroup-MMA variants against
// the kernel file: every GW_KERNELS line of grouped_gemm_wg.cu has a variant with its suffix, its
// tile columns and the shared memory its stages need, and HALO_CUDA_GROUPED_GEMM offers exactly
// those variants besides auto and mma. A variant added on one side only would launch a kernel
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
	var values []string
	for n := range groupedWGVariants {
		if !seen[n] {
			t.Errorf("variant %s has no GW_KERNELS line in grouped_gemm_wg.cu", n)
		}
		values = append(values, n)
	}
	want := append([]string{"auto", "mma"}, values...)
	slices.Sort(want)
	got := slices.Clone(swGrouped.Values)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("HALO_CUDA_GROUPED_GEMM accepts %v; want auto, mma and the variants: %v", swGrouped.Values, want)
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
