package cell

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/cell/halo"
)

func TestParseCommand(t *testing.T) {
	for _, tc := range []struct {
		line    string
		name    string
		n       int
		args    []string
		set     map[string]string
		rest    string
		wantErr []string // parts of the error; nil means success
	}{
		{line: ":step 10", name: "step", n: 10, args: []string{"10"}},
		{line: "%step", name: "step", n: 1},
		{line: "  :STEP 2  ", name: "step", n: 2, args: []string{"2"}},
		{line: ":run", name: "run", n: 0},
		{line: ":run 50", name: "run", n: 50, args: []string{"50"}},
		{line: ":profile", name: "profile", n: 3},
		{line: "%profile 5", name: "profile", n: 5, args: []string{"5"}},
		{line: ":pause", name: "pause"},
		{line: ":resume", name: "resume"},
		{line: ":status", name: "status"},
		{line: ":eval", name: "eval"},
		{line: ":save out/ckpt", name: "save", args: []string{"out/ckpt"}},
		{line: ":attach exp1", name: "attach", args: []string{"exp1"}},
		{line: ":load examples/quickstart.yaml", name: "load", args: []string{"examples/quickstart.yaml"}},
		{line: ":set lr=1e-5 max_grad_norm=0.5", name: "set", args: []string{"lr=1e-5", "max_grad_norm=0.5"}, set: map[string]string{"lr": "1e-5", "max_grad_norm": "0.5"}},
		{line: ":set lr_scheduler_type=cosine", name: "set", args: []string{"lr_scheduler_type=cosine"}, set: map[string]string{"lr_scheduler_type": "cosine"}},
		{line: ":generate What is 2+3?", name: "generate", args: []string{"What", "is", "2+3?"}, rest: "What is 2+3?"},
		{line: `:generate "  padded\n"`, name: "generate", args: []string{`"`, `padded\n"`}, rest: "  padded\n"},
		{line: ":help", name: "help"},
		{line: ":help set", name: "help", args: []string{"set"}},
		{line: ":plot lr", name: "plot", args: []string{"lr"}},

		{line: "step 2", wantErr: []string{"not a command", "start with ':'"}},
		{line: ":", wantErr: []string{"empty command", ":help"}},
		{line: ":stpe 2", wantErr: []string{"unknown command :stpe", ":help"}},
		{line: ":ste", wantErr: []string{"did you mean :step"}},
		{line: ":step x", wantErr: []string{`N = "x" is not a whole number`, "type :step [N]", "e.g. :step 10"}},
		{line: ":step 0", wantErr: []string{"out of range [1,"}},
		{line: ":step -3", wantErr: []string{"out of range"}},
		{line: ":step 99999999999", wantErr: []string{"out of range"}},
		{line: ":step 1 2", wantErr: []string{"at most one number"}},
		{line: "%profile nope", wantErr: []string{"%profile", "not a whole number", "%profile 3"}},
		{line: ":run -1", wantErr: []string{"out of range [0,"}},
		{line: ":pause now", wantErr: []string{"takes no arguments"}},
		{line: ":save", wantErr: []string{"missing DIR"}},
		{line: ":save a b", wantErr: []string{"takes one DIR"}},
		{line: ":attach", wantErr: []string{"missing NAME"}},
		{line: ":load", wantErr: []string{"missing CONFIG.yaml"}},
		{line: ":load c.yaml pretrain", name: "load", args: []string{"c.yaml", "pretrain"}},
		{line: ":load c.yaml grpo", name: "load", args: []string{"c.yaml", "grpo"}},
		{line: ":load c.yaml DPO!", wantErr: []string{`method "DPO!": a method is a lower-case name`}},
		{line: ":load a b c", wantErr: []string{"takes a config and an optional method"}},
		{line: ":set", wantErr: []string{"nothing to set", "e.g. :set lr=1e-5"}},
		{line: ":set lr", wantErr: []string{`"lr" is not KEY=VALUE`}},
		{line: ":set lr=abc", wantErr: []string{`lr="abc": want a finite number`}},
		{line: ":set lr=NaN", wantErr: []string{"finite number"}},
		{line: ":set momentum=0.9", wantErr: []string{`unknown hyperparameter "momentum"`, "learning_rate"}},
		{line: ":set lr=1 lr=2", wantErr: []string{"lr is given twice"}},
		{line: ":set grad_accum=0", wantErr: []string{"whole number of steps"}},
		{line: ":generate", wantErr: []string{"missing TEXT"}},
		{line: `:generate "open`, wantErr: []string{"not a valid quoted string"}},
		{line: ":plot acc", wantErr: []string{"want loss or lr"}},
		{line: ":help nothing", wantErr: []string{`no command "nothing"`}},
	} {
		t.Run(tc.line, func(t *testing.T) {
			c, err := ParseCommand(tc.line)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("no error, want one containing %q", tc.wantErr)
				}
				for _, p := range tc.wantErr {
					if !strings.Contains(err.Error(), p) {
						t.Fatalf("error %q does not contain %q", err, p)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Name != tc.name || c.N != tc.n || !slices.Equal(c.Args, tc.args) {
				t.Fatalf("got name %q n %d args %q, want %q %d %q", c.Name, c.N, c.Args, tc.name, tc.n, tc.args)
			}
			if tc.set != nil && !reflect.DeepEqual(c.Set, tc.set) {
				t.Fatalf("set = %v, want %v", c.Set, tc.set)
			}
			if tc.rest != "" && c.Rest != tc.rest {
				t.Fatalf("rest = %q, want %q", c.Rest, tc.rest)
			}
		})
	}
}

func TestEveryCommandHasHelpAndParsesItsExample(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Commands() {
		if seen[c.Name] {
			t.Errorf("command %s twice", c.Name)
		}
		seen[c.Name] = true
		if c.Summary == "" || c.Example == "" {
			t.Errorf("%s: missing summary or example", c.Name)
		}
		if _, err := ParseCommand(":" + c.Example); err != nil {
			t.Errorf("%s: example %q does not parse: %v", c.Name, c.Example, err)
		}
		if h := Help(":", c.Name); !strings.Contains(h, ":"+c.Name) || !strings.Contains(h, c.Summary) {
			t.Errorf("help for %s = %q", c.Name, h)
		}
		if !strings.Contains(Help("%"), "%"+c.Name) {
			t.Errorf("%%help does not list %s", c.Name)
		}
	}
	for _, want := range []string{"step", "run", "pause", "resume", "profile", "set", "save", "status", "attach", "load", "eval", "generate", "help"} {
		if !seen[want] {
			t.Errorf("no command %s", want)
		}
	}
}

func TestCommandErrorsAreCellErrors(t *testing.T) {
	it := newInterp(t)
	_, err := it.Eval(t.Context(), ":step x")
	e, ok := err.(*Error)
	if !ok || e.Kind != KindAPI || !strings.Contains(e.Message, "e.g. :step 10") {
		t.Fatalf("err = %#v", err)
	}
	r, err := it.Eval(t.Context(), "%help step")
	if err != nil || !strings.Contains(plain(r.Value), "%step [N]") {
		t.Fatalf("%%help step = %q, %v", plain(r.Value), err)
	}
}

func TestComplete(t *testing.T) {
	it := newInterp(t)
	eval(t, it, "learningCurve := 1\nimport \"strings\"")
	for _, tc := range []struct {
		src       string
		start     int
		want      []string // must be among the candidates
		notWanted []string
	}{
		{src: "halo.St", start: 5, want: []string{"Status", "Step", "Stats"}, notWanted: []string{"Save"}},
		{src: "x := halo.PlotL", start: 10, want: []string{"PlotLoss", "PlotLR", "PlotLines"}},
		{src: "strings.ToU", start: 8, want: []string{"ToUpper"}},
		{src: "learn", start: 0, want: []string{"learningCurve"}},
		{src: "ret", start: 0, want: []string{"return"}},
		{src: "ha", start: 0, want: []string{"halo"}},
		{src: ":st", start: 0, want: []string{":status", ":step"}, notWanted: []string{":save"}},
		{src: "%pro", start: 0, want: []string{"%profile"}},
		{src: ":set max", start: 5, want: []string{"max_grad_norm="}},
		{src: ":help ge", start: 6, want: []string{"generate"}},
		{src: "%layout tp=2 f", start: 13, want: []string{"fsdp"}, notWanted: []string{"tp="}},
		{src: ":layout ", start: 8, want: []string{"dp=", "tp=", "cp=", "ep=", "etp=", "fsdp", "devices="}},
		{src: "nopkg.X", start: 7},
	} {
		start, got := it.Complete(tc.src, len(tc.src))
		if start != tc.start {
			t.Errorf("Complete(%q) start = %d, want %d", tc.src, start, tc.start)
		}
		have := map[string]bool{}
		for _, g := range got {
			have[g] = true
		}
		for _, w := range tc.want {
			if !have[w] {
				t.Errorf("Complete(%q) = %q, missing %q", tc.src, got, w)
			}
		}
		for _, w := range tc.notWanted {
			if have[w] {
				t.Errorf("Complete(%q) = %q, should not offer %q", tc.src, got, w)
			}
		}
		if tc.want == nil && len(got) > 0 {
			t.Errorf("Complete(%q) = %q, want none", tc.src, got)
		}
	}
}

func TestIsComplete(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want bool
	}{
		{"", true},
		{"x := 1", true},
		{"for i := 0; i < 3; i++ {", false},
		{"for i := 0; i < 3; i++ {\n\tfmt.Println(i)\n}", true},
		{"f(1,", false},
		{"x := 1 +", false},
		{"s := `raw", false},
		{"/* open comment", false},
		{"x++", true},
		{"m := map[string]int{\n\"a\": 1,", false},
		{"halo.Step(2)", true},
		{"x := y.", false},
	} {
		if got := IsComplete(tc.src); got != tc.want {
			t.Errorf("IsComplete(%q) = %v, want %v", tc.src, got, tc.want)
		}
	}
}

func TestDocAndInspect(t *testing.T) {
	it := newInterp(t)
	for _, tc := range []struct {
		src    string
		cursor int
		want   []string // empty: nothing to document
	}{
		{src: "halo.Step(2)", cursor: 7, want: []string{"func Step(n int) []StepMetrics", "runs n optimizer steps"}},
		{src: "x := halo.Tensor.At", cursor: 19, want: []string{"func (t Tensor) At(idx ...int) float32", "element at the given indices"}},
		{src: "t := halo.Inspect", cursor: 17, want: []string{"host copy of the named parameter"}},
		{src: "%profile 3", cursor: 3, want: []string{"%profile [N]", "profile the next N steps"}},
		{src: "fmt.Println(1)", cursor: 5},
		{src: ":nosuch", cursor: 3},
		{src: "halo.NoSuchThing", cursor: 10},
	} {
		doc, ok := it.Inspect(tc.src, tc.cursor)
		if len(tc.want) == 0 {
			if ok {
				t.Errorf("Inspect(%q) = %q, want nothing", tc.src, doc)
			}
			continue
		}
		for _, w := range tc.want {
			if !ok || !strings.Contains(doc, w) {
				t.Errorf("Inspect(%q) = %q, %v; want it to contain %q", tc.src, doc, ok, w)
			}
		}
	}
	r := eval(t, it, ":doc halo.PlotLoss")
	if !strings.Contains(plain(r.Value), "func PlotLoss() Image") {
		t.Fatalf(":doc = %q", plain(r.Value))
	}
	if _, err := ParseCommand(":doc halo.Nope"); err == nil || !strings.Contains(err.Error(), "PlotLoss") {
		t.Fatalf(":doc of an unknown name: %v", err)
	}
	// Every exported function of the API has a doc comment.
	for _, n := range []string{"Session", "Context", "Attach", "Status", "Load", "LoadMethod", "Step", "Run", "RunSteps", "Pause", "Resume", "Eval", "Generate", "GenerateN", "Save", "Hyper", "Set", "SetAll", "Metrics", "Losses", "Profile", "Stats", "Inspect", "InspectGrad", "Display", "BundleOf", "Text", "PlotLoss", "PlotLR", "PlotLines", "Plot", "Doc", "Names"} {
		if d := halo.Doc(n); !strings.Contains(d, "\n\n") {
			t.Errorf("halo.%s has no doc comment: %q", n, d)
		}
	}
}

func TestGeneratedTextIsNeverBlank(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"85", "85"},
		{" 85\n", " 85\n"},
		{"", "(the model generated no text: it ended the sequence at once, as a model early in training often does)"},
		{" \n", `(only white space: " \n")`},
	} {
		if got := generatedText(tc.in); got != tc.want {
			t.Errorf("generatedText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
