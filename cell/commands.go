package cell

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/cell/halo"
	"github.com/halo-shell/halo-shell/internal/layoutspec"
)

// Command is a parsed command line: ":step 10" in the REPL, "%step 10" in a notebook.
type Command struct {
	Prefix string   // ":" or "%"
	Name   string   // the command, lower case
	Args   []string // the words after the name
	Rest   string   // everything after the name, trimmed (for generate)
	N      int      // the step count of step, run and profile
	Set    map[string]string
}

// CommandSpec describes one command.
type CommandSpec struct {
	Name    string
	Usage   string // arguments, e.g. "N"
	Summary string
	Example string
	check   func(c *Command) error
	run     func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error)
}

var commands []*CommandSpec

func init() {
	commands = []*CommandSpec{
		{Name: "step", Usage: "[N]", Summary: "run N optimizer steps now (default 1) and print their metrics", Example: "step 10",
			check: countArg(1), run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				var ms []halo.StepMetrics
				if err := apiCall(func() { ms = halo.Step(c.N) }); err != nil {
					return nil, err
				}
				return text(halo.Text(ms)), nil
			}},
		{Name: "run", Usage: "[N]", Summary: "train in the background, for N steps or until the planned total (N omitted)", Example: "run",
			check: countArg(0), run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return statusCall(func() halo.SessionStatus { return halo.RunSteps(c.N) })
			}},
		{Name: "pause", Summary: "stop a background run at the next step boundary", Example: "pause",
			check: noArgs, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return statusCall(halo.Pause)
			}},
		{Name: "resume", Summary: "continue a paused run", Example: "resume",
			check: noArgs, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return statusCall(halo.Resume)
			}},
		{Name: "profile", Usage: "[N]", Summary: "profile the next N steps (default 3): time by op class, collective and host", Example: "profile 3",
			check: countArg(3), run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				var p halo.ProfileReport
				if err := apiCall(func() { p = halo.Profile(c.N) }); err != nil {
					return nil, err
				}
				return halo.BundleOf(p), nil
			}},
		{Name: "set", Usage: "KEY=VALUE ...", Summary: "change hyperparameters from the next step on (" + strings.Join(halo.HyperKeys(), ", ") + ")", Example: "set lr=1e-5 max_grad_norm=0.5",
			check: checkSet, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				var h halo.Hyperparams
				if err := apiCall(func() { h = halo.SetAll(c.Set) }); err != nil {
					return nil, err
				}
				return text(h.String()), nil
			}},
		{Name: "layout", Usage: "[dp=N tp=N cp=N ep=N etp=N fsdp devices=LIST]", Summary: "show the parallel layout, or move the run to another one at the next step boundary (dp=1: one device)", Example: "layout tp=2 fsdp",
			check: checkLayout, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				var l halo.LayoutInfo
				if err := apiCall(func() { l = halo.Layout(c.Rest) }); err != nil {
					return nil, err
				}
				return text(l.String()), nil
			}},
		{Name: "save", Usage: "DIR", Summary: "write a checkpoint (Hugging Face model and trainer state) into DIR on the session's machine", Example: "save out/ckpt",
			check: oneArg("DIR", "the directory to write the checkpoint into"), run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				var dir string
				if err := apiCall(func() { dir = halo.Save(c.Args[0]) }); err != nil {
					return nil, err
				}
				return text("saved to " + dir), nil
			}},
		{Name: "status", Summary: "describe the attached session", Example: "status",
			check: noArgs, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return statusCall(halo.Status)
			}},
		{Name: "takeover", Summary: "take control of the session from the client that holds it (it can take it back the same way)", Example: "takeover",
			check: noArgs, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return statusCall(halo.TakeOver)
			}},
		{Name: "release", Summary: "give up control of the session so that another client can claim it", Example: "release",
			check: noArgs, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return statusCall(halo.Release)
			}},
		{Name: "attach", Usage: "NAME", Summary: "attach to another session (a name, a socket path or tcp://HOST:PORT); the current one keeps running", Example: "attach exp1",
			check: oneArg("NAME", "the session's name"), run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return statusCall(func() halo.SessionStatus { return halo.Attach(c.Args[0]) })
			}},
		{Name: "load", Usage: "[--force] CONFIG.yaml [METHOD]", Summary: "load a model, optimizer and data from a YAML config into the session with a training method (sft by default; pretrain, grpo, ... as the session's halo-shell offers them); --force replaces a model with unsaved steps", Example: "load examples/quickstart.yaml",
			check: checkLoad, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				force, args := loadArgs(c.Args)
				method := ""
				if len(args) == 2 {
					method = args[1]
				}
				if force {
					return statusCall(func() halo.SessionStatus { return halo.LoadForce(args[0], method) })
				}
				return statusCall(func() halo.SessionStatus { return halo.LoadMethod(args[0], method) })
			}},
		{Name: "eval", Summary: "compute the held-out loss", Example: "eval",
			check: noArgs, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				var l float64
				if err := apiCall(func() { l = halo.Eval() }); err != nil {
					return nil, err
				}
				return text(fmt.Sprintf("eval loss %.4f", l)), nil
			}},
		{Name: "generate", Usage: "TEXT", Summary: "continue TEXT with the model (greedy, 64 tokens)", Example: `generate What is 2+3?`,
			check: checkGenerate, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				var s string
				if err := apiCall(func() { s = halo.Generate(c.Rest) }); err != nil {
					return nil, err
				}
				return text(generatedText(s)), nil
			}},
		{Name: "plot", Usage: "[loss|lr]", Summary: "plot the loss (default) or learning rate of the steps seen so far", Example: "plot loss",
			check: checkPlot, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				var im halo.Image
				err := apiCall(func() {
					if len(c.Args) == 1 && c.Args[0] == "lr" {
						im = halo.PlotLR()
					} else {
						im = halo.PlotLoss()
					}
				})
				if err != nil {
					return nil, err
				}
				return im.Bundle(), nil
			}},
		{Name: "doc", Usage: "NAME", Summary: "show the documentation of a halo API name (a function, type or method)", Example: "doc halo.Step",
			check: checkDoc, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return text(halo.Doc(c.Args[0])), nil
			}},
		{Name: "help", Usage: "[COMMAND]", Summary: "list the commands, or describe one", Example: "help set",
			check: checkHelp, run: func(ctx context.Context, it *Interpreter, c *Command) (Bundle, error) {
				return text(Help(c.Prefix, c.Args...)), nil
			}},
	}
}

// checkLayout checks the syntax of the layout words as the session reads them
// (layoutspec.CheckSpec), so that a misspelt word is caught before anything is sent; whether
// the layout suits the model and devices only the session can say.
func checkLayout(c *Command) error {
	if c.Rest == "" {
		return nil
	}
	if err := layoutspec.CheckSpec(c.Rest); err != nil {
		return fmt.Errorf("%slayout: %w", c.Prefix, err)
	}
	return nil
}

// Commands lists the commands, in help order.
func Commands() []CommandSpec {
	out := make([]CommandSpec, len(commands))
	for i, c := range commands {
		out[i] = *c
	}
	return out
}

func lookup(name string) *CommandSpec {
	for _, c := range commands {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Help describes every command, or the named ones, with prefix (":" or "%") in front.
func Help(prefix string, names ...string) string {
	if prefix == "" {
		prefix = ":"
	}
	var b strings.Builder
	if len(names) == 0 {
		b.WriteString("Commands (Go statements and expressions are evaluated; the halo package drives the session):\n")
		for _, c := range commands {
			use := prefix + c.Name
			if c.Usage != "" {
				use += " " + c.Usage
			}
			fmt.Fprintf(&b, "  %-26s %s\n", use, c.Summary)
		}
		fmt.Fprintf(&b, "Type %shelp COMMAND for an example. Go API: halo.Step(n), halo.Run(), halo.Pause(), halo.Status(), halo.TakeOver(), halo.Metrics(), halo.Profile(k), halo.Inspect(name), halo.Set(key, value), halo.Layout(spec), halo.Save(dir), halo.Generate(prompt), halo.GenerateBase(prompt, n), halo.Adapters(), halo.PlotLoss(), halo.Display(v).", prefix)
		return b.String()
	}
	for i, n := range names {
		c := lookup(strings.ToLower(strings.TrimLeft(n, ":%")))
		if c == nil {
			fmt.Fprintf(&b, "unknown command %q; type %shelp for the list", n, prefix)
			continue
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s%s %s\n  %s\n  example: %s%s", prefix, c.Name, c.Usage, c.Summary, prefix, c.Example)
	}
	return strings.TrimRight(b.String(), "\n")
}

// ParseCommand parses a command line starting with ':' or '%'. Errors say what to type.
func ParseCommand(line string) (*Command, error) {
	line = strings.TrimSpace(line)
	if line == "" || (line[0] != ':' && line[0] != '%') {
		return nil, fmt.Errorf("%q is not a command: commands start with ':' (REPL) or '%%' (notebook), e.g. :help", line)
	}
	c := &Command{Prefix: line[:1]}
	body := strings.TrimSpace(line[1:])
	if body == "" {
		return nil, fmt.Errorf("empty command: type %shelp for the list", c.Prefix)
	}
	name, rest, _ := strings.Cut(body, " ")
	c.Name = strings.ToLower(name)
	c.Rest = strings.TrimSpace(rest)
	c.Args = strings.Fields(c.Rest)
	spec := lookup(c.Name)
	if spec == nil {
		var near []string
		for _, s := range commands {
			if strings.HasPrefix(s.Name, c.Name) || strings.HasPrefix(c.Name, s.Name) {
				near = append(near, c.Prefix+s.Name)
			}
		}
		msg := fmt.Sprintf("unknown command %s%s", c.Prefix, name)
		if len(near) > 0 {
			msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(near, " or "))
		}
		return nil, errors.New(msg + fmt.Sprintf("; type %shelp for the list", c.Prefix))
	}
	if err := spec.check(c); err != nil {
		return nil, fmt.Errorf("%s%s: %v; type %s%s %s, e.g. %s%s", c.Prefix, c.Name, err, c.Prefix, c.Name, spec.Usage, c.Prefix, spec.Example)
	}
	return c, nil
}

func noArgs(c *Command) error {
	if len(c.Args) > 0 {
		return fmt.Errorf("takes no arguments, got %q", c.Rest)
	}
	return nil
}

// maxCount bounds step counts so that a typo cannot queue a run of billions of steps.
const maxCount = 1 << 30

func countArg(def int) func(c *Command) error {
	return func(c *Command) error {
		switch len(c.Args) {
		case 0:
			c.N = def
			return nil
		case 1:
			n, err := strconv.Atoi(c.Args[0])
			if err != nil {
				return fmt.Errorf("count N = %q is not a whole number", c.Args[0])
			}
			lo := 1
			if def == 0 {
				lo = 0
			}
			if n < lo || n > maxCount {
				return fmt.Errorf("count N = %d is out of range [%d, %d]", n, lo, maxCount)
			}
			c.N = n
			return nil
		}
		return fmt.Errorf("takes at most one number, got %q", c.Rest)
	}
}

func oneArg(what, desc string) func(c *Command) error {
	return func(c *Command) error {
		switch len(c.Args) {
		case 0:
			return fmt.Errorf("missing %s (%s)", what, desc)
		case 1:
			return nil
		}
		return fmt.Errorf("takes one %s, got %d words %q", what, len(c.Args), c.Rest)
	}
}

func checkSet(c *Command) error {
	if len(c.Args) == 0 {
		return errors.New("nothing to set")
	}
	c.Set = map[string]string{}
	for _, a := range c.Args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" || v == "" {
			return fmt.Errorf("%q is not KEY=VALUE", a)
		}
		if _, dup := c.Set[k]; dup {
			return fmt.Errorf("%s is given twice", k)
		}
		c.Set[k] = v
	}
	_, err := halo.HyperRequest(c.Set)
	return err
}

func checkGenerate(c *Command) error {
	if c.Rest == "" {
		return errors.New("missing TEXT (the prompt to continue)")
	}
	if len(c.Rest) >= 2 && c.Rest[0] == '"' {
		s, err := strconv.Unquote(c.Rest)
		if err != nil {
			return fmt.Errorf("TEXT %s is not a valid quoted string: %v", c.Rest, err)
		}
		c.Rest = s
	}
	return nil
}

func checkPlot(c *Command) error {
	if len(c.Args) > 1 || (len(c.Args) == 1 && c.Args[0] != "loss" && c.Args[0] != "lr") {
		return fmt.Errorf("want loss or lr, got %q", c.Rest)
	}
	return nil
}

func checkHelp(c *Command) error {
	for _, a := range c.Args {
		if lookup(strings.ToLower(strings.TrimLeft(a, ":%"))) == nil {
			names := make([]string, len(commands))
			for i, s := range commands {
				names[i] = s.Name
			}
			sort.Strings(names)
			return fmt.Errorf("no command %q (commands: %s)", a, strings.Join(names, ", "))
		}
	}
	return nil
}

func text(s string) Bundle { return Bundle{"text/plain": []byte(s)} }

// apiCall runs f and turns a halo API panic into an error.
func apiCall(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if he, ok := r.(*halo.Error); ok {
				err = &Error{Kind: KindAPI, Message: he.Error()}
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}

func statusCall(f func() halo.SessionStatus) (Bundle, error) {
	var st halo.SessionStatus
	if err := apiCall(func() { st = f() }); err != nil {
		return nil, err
	}
	return text(st.String()), nil
}

// runCommand parses and runs one command line.
func (it *Interpreter) runCommand(ctx context.Context, line string) (Bundle, error) {
	c, err := ParseCommand(line)
	if err != nil {
		return nil, &Error{Kind: KindAPI, Message: err.Error()}
	}
	b, err := lookup(c.Name).run(ctx, it, c)
	if err != nil && ctx.Err() != nil {
		return nil, &Error{Kind: KindInterrupted, Message: "interrupted (the session is not affected)"}
	}
	return b, err
}

func checkDoc(c *Command) error {
	if err := oneArg("NAME", "a halo API name such as halo.Step")(c); err != nil {
		return err
	}
	if halo.Doc(c.Args[0]) == "" {
		return fmt.Errorf("no halo API name %q (names: %s)", c.Args[0], strings.Join(halo.Names(), ", "))
	}
	return nil
}

// loadArgs splits --force from the other words of a load command.
func loadArgs(words []string) (force bool, args []string) {
	for _, w := range words {
		if w == "--force" || w == "-f" {
			force = true
			continue
		}
		args = append(args, w)
	}
	return force, args
}

func checkLoad(c *Command) error {
	_, args := loadArgs(c.Args)
	for _, w := range args {
		if strings.HasPrefix(w, "-") {
			return fmt.Errorf("unknown option %q: the only option is --force", w)
		}
	}
	switch len(args) {
	case 0:
		return errors.New("missing CONFIG.yaml (the path of a YAML config)")
	case 1:
		return nil
	case 2:
		return halo.CheckMethodName(args[1])
	}
	return fmt.Errorf("takes a config and an optional method, got %d words %q", len(args), strings.Join(args, " "))
}

// generatedText is what :generate prints for the text s a model generated: s itself, quoted
// when it is only white space (so that it is seen), and a sentence when it is empty (the
// model ended the sequence, or produced only tokens that decode to nothing).
func generatedText(s string) string {
	switch {
	case s == "":
		return "(the model generated no text: it ended the sequence at once, as a model early in training often does)"
	case strings.TrimSpace(s) == "":
		return fmt.Sprintf("(only white space: %q)", s)
	}
	return s
}
