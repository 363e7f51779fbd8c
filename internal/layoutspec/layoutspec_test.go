package layoutspec

import (
	"slices"
	"strings"
	"testing"
)

func TestParseDevicesRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in, kind string
		ids      []int
		back     string
	}{
		{"cpu", "cpu", []int{0}, "cpu:1"},
		{"cpu:4", "cpu", []int{0, 1, 2, 3}, "cpu:4"},
		{"cuda", "cuda", []int{0}, "cuda:0"},
		{"cuda:0-3", "cuda", []int{0, 1, 2, 3}, "cuda:0-3"},
		{" cuda:1-2,4 ", "cuda", []int{1, 2, 4}, "cuda:1,2,4"},
	} {
		d, err := ParseDevices(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if d.Kind != tc.kind || !slices.Equal(d.IDs, tc.ids) || d.String() != tc.back {
			t.Errorf("%q: got %s %v (%s), want %s %v (%s)", tc.in, d.Kind, d.IDs, d, tc.kind, tc.ids, tc.back)
		}
	}
	if (Devices{}).String() != "" {
		t.Errorf("zero Devices = %q, want empty", Devices{}.String())
	}
}

func TestParseLayoutRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Layout
		str  string
	}{
		{"ep=2 tp=2", Layout{EP: 2, TP: 2}, "dp=1 tp=2 cp=1 ep=2 etp=1"},
		{"dp=2,fsdp,cp=2", Layout{DP: 2, FSDP: true, CP: 2}, "dp=2 fsdp tp=1 cp=2 ep=1 etp=1"},
		{"fsdp=false\ttp=4 ETP=4", Layout{TP: 4, ETP: 4}, "dp=1 tp=4 cp=1 ep=1 etp=4"},
		{"", Layout{}, "dp=1 tp=1 cp=1 ep=1 etp=1"},
	} {
		got, err := ParseLayout(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if got != tc.want || got.String() != tc.str {
			t.Errorf("%q: got %+v (%s), want %+v (%s)", tc.in, got, got, tc.want, tc.str)
		}
		back, err := ParseLayout(got.String())
		if err != nil || back.String() != tc.str {
			t.Errorf("%q: String does not read back: %+v, %v", tc.in, back, err)
		}
	}
}

// Every refusal names the string and the word at fault, without a package prefix.
func TestCheckSpecErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"pp=2", `layout "pp=2": unknown key "pp" (keys: dp, fsdp, tp, cp, ep, etp)`},
		{"tp", `layout "tp": tp needs a degree from 1 to 4096, like tp=2`},
		{"tp=0", "tp needs a degree"},
		{"tp=4097", "tp needs a degree"},
		{"tp=2 TP=4", "tp is given twice"},
		{"fsdp=maybe", "fsdp=maybe: use fsdp, fsdp=true or fsdp=false"},
		{"tp=2 devices=cpu:2 DEVICES=cpu:4", `layout "tp=2 devices=cpu:2 DEVICES=cpu:4": devices is given twice`},
		{"devices=gpu:0", `devices "gpu:0": unknown kind "gpu"`},
		{"devices=cpu:0", `devices "cpu:0": after cpu: give the number of simulated devices, 1 to 4096`},
		{"devices=cuda:3-1", `"3-1" is not a device index`},
	} {
		err := CheckSpec(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckSpec(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
	for _, ok := range []string{"", "tp=2 fsdp devices=cpu:4", "ep=2,etp=2 devices=cuda:0-7", "Devices=cuda"} {
		if err := CheckSpec(ok); err != nil {
			t.Errorf("CheckSpec(%q) = %v, want nil", ok, err)
		}
	}
}

func TestSplitSpec(t *testing.T) {
	for _, tc := range []struct{ in, words, devs string }{
		{"tp=2 fsdp devices=cpu:4", "tp=2 fsdp", "cpu:4"},
		{"devices=cuda:0,2,tp=2", "2 tp=2", "cuda:0"}, // commas separate words, so lists need ranges
		{"ep=2", "ep=2", ""},
	} {
		w, d, err := SplitSpec(tc.in)
		if err != nil || w != tc.words || d != tc.devs {
			t.Errorf("SplitSpec(%q) = %q, %q, %v; want %q, %q", tc.in, w, d, err, tc.words, tc.devs)
		}
	}
}
