package cuda

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func TestSummarizeInt32(t *testing.T) {
	big := make([]int32, hostInt32CopyMax+1)
	big[7] = -3
	big[9] = 99
	tests := []struct {
		name                   string
		vals                   []int32
		min, max               int32
		minValid, maxValid     int32
		hasValid, keepsHostVal bool
	}{
		{"plain", []int32{5, 2, 9}, 2, 9, 2, 9, true, true},
		{"ignore index excluded from the valid range", []int32{7, backend.IgnoreIndex, 3}, backend.IgnoreIndex, 7, 3, 7, true, true},
		{"all ignored", []int32{backend.IgnoreIndex, backend.IgnoreIndex}, backend.IgnoreIndex, backend.IgnoreIndex, 0, 0, false, true},
		{"empty", nil, 0, 0, 0, 0, false, true},
		{"too large for a host copy", big, -3, 99, -3, 99, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := summarizeInt32(tc.vals)
			if s.n != len(tc.vals) || s.min != tc.min || s.max != tc.max || s.hasValid != tc.hasValid {
				t.Fatalf("summary n=%d min=%d max=%d hasValid=%v, want n=%d min=%d max=%d hasValid=%v", s.n, s.min, s.max, s.hasValid, len(tc.vals), tc.min, tc.max, tc.hasValid)
			}
			if tc.hasValid && (s.minValid != tc.minValid || s.maxValid != tc.maxValid) {
				t.Fatalf("valid range [%d, %d], want [%d, %d]", s.minValid, s.maxValid, tc.minValid, tc.maxValid)
			}
			if (s.host != nil) != tc.keepsHostVal {
				t.Fatalf("host copy kept = %v, want %v", s.host != nil, tc.keepsHostVal)
			}
			if s.host != nil && !slices.Equal(s.host, tc.vals) {
				t.Fatalf("host copy %v, want %v", s.host, tc.vals)
			}
		})
	}
}

// TestInt32RecordsInvalidation records [base, base+40) (10 values) and checks which writes drop it.
func TestInt32RecordsInvalidation(t *testing.T) {
	const base = uintptr(1 << 20)
	tests := []struct {
		name  string
		p     uintptr
		bytes uint64
		drops bool
	}{
		{"same range", base, 40, true},
		{"first byte", base, 1, true},
		{"last byte", base + 39, 1, true},
		{"covering", base - 100, 1000, true},
		{"ending just before", base - 8, 8, false},
		{"starting just after", base + 40, 8, false},
		{"far away", base + 1<<20, 4096, false},
		{"zero bytes at the start still counts as touching it", base, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r i32Records
			r.record(base, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
			r.invalidate(tc.p, tc.bytes)
			_, ok := r.values(base, 10)
			if ok == tc.drops {
				t.Fatalf("after a write of [%#x, +%d) the record is known = %v, want %v", tc.p, tc.bytes, ok, !tc.drops)
			}
		})
	}
}

func TestInt32RecordsLookup(t *testing.T) {
	var r i32Records
	const base = uintptr(4096)
	r.record(base, []int32{10, 11, 12, 13, 14, 15})
	tests := []struct {
		name string
		p    uintptr
		n    int
		want []int32
		ok   bool
	}{
		{"whole", base, 6, []int32{10, 11, 12, 13, 14, 15}, true},
		{"prefix", base, 2, []int32{10, 11}, true},
		{"view inside", base + 8, 3, []int32{12, 13, 14}, true},
		{"view to the end", base + 20, 1, []int32{15}, true},
		{"past the end", base + 20, 2, nil, false},
		{"misaligned", base + 2, 1, nil, false},
		{"before", base - 4, 2, nil, false},
		{"unknown address", 1 << 30, 1, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := r.values(tc.p, tc.n)
			if ok != tc.ok || !slices.Equal(got, tc.want) {
				t.Fatalf("values(%#x, %d) = %v, %v; want %v, %v", tc.p, tc.n, got, ok, tc.want, tc.ok)
			}
		})
	}
	// A new upload over part of the record replaces it.
	r.record(base+8, []int32{7})
	if _, ok := r.values(base, 6); ok {
		t.Fatal("the old record survived an upload over part of it")
	}
	if got, ok := r.values(base+8, 1); !ok || got[0] != 7 {
		t.Fatalf("values of the new upload = %v, %v; want [7], true", got, ok)
	}
}

func TestInt32RecordsBounded(t *testing.T) {
	var r i32Records
	for i := range hostInt32MaxRecords + 10 {
		r.record(uintptr(4096*(i+1)), []int32{int32(i)})
	}
	if r.len() != hostInt32MaxRecords {
		t.Fatalf("%d records kept, want the bound %d", r.len(), hostInt32MaxRecords)
	}
	if _, ok := r.values(4096, 1); ok {
		t.Fatal("the oldest record was kept past the bound")
	}
	if v, ok := r.values(uintptr(4096*(hostInt32MaxRecords+10)), 1); !ok || v[0] != hostInt32MaxRecords+9 {
		t.Fatalf("newest record = %v, %v", v, ok)
	}
}

func TestInt32CheckRange(t *testing.T) {
	big := make([]int32, hostInt32CopyMax+1)
	big[5] = 50 // out of range for limit 10; no host copy is kept
	tests := []struct {
		name        string
		vals        []int32
		p           uintptr // offset in bytes from the record's start
		n           int     // 0 means all
		limit       int32
		allowIgnore bool
		want        i32Check
		at          int
		val         int32
	}{
		{"valid", []int32{0, 3, 9}, 0, 0, 10, false, i32Valid, 0, 0},
		{"first bad by position", []int32{0, 12, -1}, 0, 0, 10, false, i32Bad, 1, 12},
		{"negative", []int32{0, -1}, 0, 0, 10, false, i32Bad, 1, -1},
		{"ignore index allowed", []int32{backend.IgnoreIndex, 4}, 0, 0, 10, true, i32Valid, 0, 0},
		{"ignore index not allowed", []int32{backend.IgnoreIndex, 4}, 0, 0, 10, false, i32Bad, 0, backend.IgnoreIndex},
		{"bad target after ignored ones", []int32{backend.IgnoreIndex, 3, 10}, 0, 0, 10, true, i32Bad, 2, 10},
		{"view excludes the bad element", []int32{1, 2, 30}, 0, 2, 10, false, i32Valid, 0, 0},
		{"view positions are relative", []int32{1, 2, 30}, 4, 2, 10, false, i32Bad, 1, 30},
		{"no host copy, range fine", make([]int32, hostInt32CopyMax+1), 0, 0, 10, false, i32Valid, 0, 0},
		{"no host copy, range bad: the device finds it", big, 0, 0, 10, false, i32Unknown, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r i32Records
			const base = uintptr(1 << 16)
			r.record(base, tc.vals)
			n := tc.n
			if n == 0 {
				n = len(tc.vals)
			}
			got, at, v := r.checkRange(base+tc.p, n, tc.limit, tc.allowIgnore)
			if got != tc.want || (got == i32Bad && (at != tc.at || v != tc.val)) {
				t.Fatalf("checkRange = %v at %d value %d; want %v at %d value %d", got, at, v, tc.want, tc.at, tc.val)
			}
		})
	}
	var r i32Records
	if got, _, _ := r.checkRange(4096, 3, 10, false); got != i32Unknown {
		t.Fatalf("checkRange without a record = %v, want i32Unknown", got)
	}
}

// TestEmbeddingBackwardMeta compares the sort metadata with a plain stable sort.
func TestEmbeddingBackwardMeta(t *testing.T) {
	for _, ids := range [][]int32{
		{3, 1, 3, 0, 1, 3},
		{5},
		{2, 2, 2, 2},
		{9, 8, 7, 6, 5, 4, 3, 2, 1, 0},
	} {
		t.Run(fmt.Sprint(ids), func(t *testing.T) {
			meta, nOrder, nUniq, err := embeddingBackwardMeta(ids, 10)
			if err != nil {
				t.Fatal(err)
			}
			vals := make([]int32, len(meta)/4)
			for i := range vals {
				vals[i] = int32(binary.LittleEndian.Uint32(meta[4*i:]))
			}
			order := make([]int32, len(ids))
			for i := range order {
				order[i] = int32(i)
			}
			sort.SliceStable(order, func(a, b int) bool { return ids[order[a]] < ids[order[b]] })
			var uniq, seg []int32
			for k, n := range order {
				if k == 0 || ids[n] != ids[order[k-1]] {
					uniq = append(uniq, ids[n])
					seg = append(seg, int32(k))
				}
			}
			seg = append(seg, int32(len(ids)))
			want := append(append(append([]int32{}, order...), uniq...), seg...)
			if nOrder != len(ids) || nUniq != len(uniq) || !slices.Equal(vals, want) {
				t.Fatalf("meta = %v (order %d, uniq %d); want %v (order %d, uniq %d)", vals, nOrder, nUniq, want, len(ids), len(uniq))
			}
		})
	}
	if _, _, _, err := embeddingBackwardMeta([]int32{1, 10}, 10); err == nil || !strings.Contains(err.Error(), "ids[1] = 10") {
		t.Fatalf("out-of-range id: err = %v, want one naming ids[1] = 10", err)
	}
}

func TestOpFromFrames(t *testing.T) {
	tests := []struct {
		frames []string
		want   string
	}{
		{[]string{pkgPath + "(*Device).syncOnThread", pkgPath + "(*Backend).readFlagOnThread", pkgPath + "(*Backend).Embedding.func1", pkgPath + "(*Device).Do.func1", pkgPath + "(*Device).loop"}, "Embedding"},
		{[]string{pkgPath + "(*Device).syncOnThread", pkgPath + "(*Device).Synchronize.func1", pkgPath + "(*Device).Do.func1", pkgPath + "(*Device).loop", "runtime.goexit"}, "Device.Synchronize"},
		{[]string{pkgPath + "(*Device).syncOnThread", pkgPath + "(*Backend).checkCuSeqlens.func1", pkgPath + "(*Device).loop"}, "checkCuSeqlens"},
		{[]string{pkgPath + "(*Event).ElapsedMs.func1", pkgPath + "(*Device).Do.func1"}, "Event.ElapsedMs"},
		{[]string{"runtime.goexit"}, "unknown"},
	}
	for _, tc := range tests {
		if got := opFromFrames(tc.frames); got != tc.want {
			t.Errorf("opFromFrames(%v) = %q, want %q", tc.frames, got, tc.want)
		}
	}
}

// TestBackendKeepsIndexRecordsCurrent drives the backend's writers on a device without CUDA
// (their device work fails) and checks each drops the record of the memory it writes, and that
// ops validate recorded ids on the host without synchronising.
func TestBackendKeepsIndexRecordsCurrent(t *testing.T) {
	b := fakeBackend(t)
	f32 := tensor.F32
	writers := []struct {
		name  string
		write func(dst tensor.Tensor) error
	}{
		{"Free", func(dst tensor.Tensor) error { return b.Free(dst) }},
		{"Fill", func(dst tensor.Tensor) error { return b.Fill(dst, 1) }},
		{"Copy", func(dst tensor.Tensor) error { return b.Copy(dst, ft(b, tensor.I32, 4)) }},
		{"Upload", func(dst tensor.Tensor) error { return b.Upload(dst, make([]byte, 16)) }},
		{"NoteDeviceWrite", func(dst tensor.Tensor) error { b.NoteDeviceWrite(dst); return nil }},
		{"Copy into a float view of the memory", func(dst tensor.Tensor) error {
			v, _ := tensor.New(dst.Buffer(), 4, f32, 1)
			return b.Copy(v, ft(b, f32, 1))
		}},
	}
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			ids := ft(b, tensor.I32, 4)
			p, _ := b.ptr("test", "ids", ids)
			b.i32.record(p, []int32{1, 2, 3, 4})
			_ = w.write(ids) // the device part fails without CUDA; the old record must go regardless
			// A posted upload records what it uploads (its failure is reported by the next call).
			if v, ok := b.hostInt32(p, 4); ok && slices.Equal(v, []int32{1, 2, 3, 4}) {
				t.Fatalf("after %s the backend still returns the old host copy %v", w.name, v)
			}
		})
	}

	t.Run("Embedding rejects a recorded bad id without the device", func(t *testing.T) {
		w, out, ids := ft(b, tensor.BF16, 10, 4), ft(b, tensor.BF16, 3, 4), ft(b, tensor.I32, 3)
		p, _ := b.ptr("test", "ids", ids)
		b.i32.record(p, []int32{1, 12, -1})
		_ = b.d.Do(func() error { return nil }) // earlier posted work counts its waits first
		before := b.Syncs().Total
		err := b.Embedding(out, w, ids)
		if err == nil || !strings.Contains(err.Error(), "ids[1] = 12 is outside the vocabulary [0, 10)") {
			t.Fatalf("Embedding = %v, want the error naming ids[1] = 12", err)
		}
		if n := b.Syncs().Total - before; n != 0 {
			t.Fatalf("Embedding synchronised %d times validating uploaded ids", n)
		}
	})
	t.Run("CrossEntropy rejects a recorded bad target before any device work", func(t *testing.T) {
		h, w, tg := ft(b, tensor.BF16, 3, 8), ft(b, tensor.BF16, 5, 8), ft(b, tensor.I32, 3)
		p, _ := b.ptr("test", "targets", tg)
		b.i32.record(p, []int32{0, backend.IgnoreIndex, 9})
		_ = b.d.Do(func() error { return nil }) // earlier posted work counts its waits first
		before := b.Syncs().Total
		err := b.CrossEntropy(backend.CrossEntropyArgs{Hidden: h, Weight: w, Targets: tg})
		want := "Targets[2] = 9 is outside the vocabulary [0, 5) and is not the ignore index -100"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("CrossEntropy = %v, want the error naming %s", err, want)
		}
		if n := b.Syncs().Total - before; n != 0 {
			t.Fatalf("CrossEntropy synchronised %d times validating uploaded targets", n)
		}
	})
	t.Run("Download counts a synchronisation named after it", func(t *testing.T) {
		x := ft(b, f32, 2)
		_ = b.d.Do(func() error { return nil }) // let posted work (and its waits) run first
		before := b.Syncs()
		_ = b.Download(make([]byte, 8), x)
		after := b.Syncs()
		if after.Total != before.Total+1 || after.ByOp["Download"] != before.ByOp["Download"]+1 || after.Last != "Download" {
			t.Fatalf("syncs before %+v, after %+v; want one more, by Download", before, after)
		}
	})
}
