package nbrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/kernel/internal/wire"
)

// Options configure Run.
type Options struct {
	// Kernel is the command that starts the kernel, as a kernelspec's argv: the word
	// ConnectionFileArg is replaced by the path of the connection file. Required.
	Kernel []string
	// KernelName is written into the connection file (default none).
	KernelName string
	// Env is the kernel's environment (nil: this process's).
	Env []string
	// Dir is the kernel's working directory (empty: this process's).
	Dir string
	// Timeout bounds one cell's run; a cell that runs past it is interrupted and the run
	// fails naming it. Zero means no limit.
	Timeout time.Duration
	// InterruptWait is how long a kernel may take to end an interrupted cell before it is
	// stopped (default 10s).
	InterruptWait time.Duration
	// StartTimeout bounds the kernel's start, until it answers kernel_info (default 60s).
	StartTimeout time.Duration
	// AllowErrors goes on past cells that fail; without it the run stops at the first.
	AllowErrors bool
	// KernelLog receives the kernel's stderr as it is written (nil: only its end is kept,
	// quoted when the kernel fails).
	KernelLog io.Writer
	// OnCell, when set, is called after each code cell has run, with its position among
	// all cells (from 1), the time it took and its error (nil when it succeeded).
	OnCell func(index int, c *Cell, took time.Duration, err error)
}

// Result is what a run did.
type Result struct {
	// Ran is the number of code cells executed.
	Ran int
	// Failed are the cells that failed (only the first, unless AllowErrors).
	Failed []*CellError
	// Elapsed is the run's wall time, the kernel's start included.
	Elapsed time.Duration
}

// CellError is a cell that failed or ran past its timeout.
type CellError struct {
	// Index is the cell's position among all cells of the notebook, from 1.
	Index int
	// ID and FirstLine name the cell: its id and the first line of its source.
	ID, FirstLine string
	// Ename and Evalue are the kernel's error, when it sent one.
	Ename, Evalue string
	// Timeout is the limit the cell ran past (zero when it failed by itself).
	Timeout time.Duration
	// Detail says more: what happened after the interrupt, or that the kernel exited.
	Detail string
}

func (e *CellError) Error() string {
	name := fmt.Sprintf("cell %d", e.Index)
	if e.ID != "" {
		name += " (id " + e.ID + ")"
	}
	if e.FirstLine != "" {
		name += fmt.Sprintf(" %q", e.FirstLine)
	}
	var s string
	switch {
	case e.Timeout > 0:
		s = fmt.Sprintf("nbrun: %s ran past the cell timeout of %v and was interrupted", name, e.Timeout)
		if e.Ename != "" {
			s += fmt.Sprintf(" (%s: %s)", e.Ename, e.Evalue)
		}
		s += "; give it more time (--timeout) or make it smaller"
	case e.Ename != "":
		s = fmt.Sprintf("nbrun: %s failed: %s: %s", name, e.Ename, e.Evalue)
	default:
		s = fmt.Sprintf("nbrun: %s failed", name)
	}
	if e.Detail != "" {
		s += "; " + e.Detail
	}
	return s
}

// Run executes the code cells of nb in order on a kernel started from o.Kernel, replacing
// each code cell's outputs and execution count with this run's (cells the run did not reach
// are left with none), and sets the notebook's language_info to the kernel's. It returns an
// error for the first failing cell (a *CellError) unless o.AllowErrors, for a cell that runs
// past o.Timeout (always), and for a kernel that cannot be started or exits; nb then holds
// what the cells produced up to there, ready to be written.
func Run(ctx context.Context, nb *Notebook, o Options) (*Result, error) {
	if len(o.Kernel) == 0 {
		return &Result{}, errors.New("nbrun: no kernel command")
	}
	if o.InterruptWait <= 0 {
		o.InterruptWait = 10 * time.Second
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 60 * time.Second
	}
	start := time.Now()
	for _, c := range nb.Cells {
		if c.Type == "code" {
			c.reset, c.Outputs, c.ExecutionCount, c.Timing = true, nil, nil, nil
		}
	}
	res := &Result{}
	k, err := startKernel(ctx, &o)
	if err != nil {
		res.Elapsed = time.Since(start)
		return res, err
	}
	defer k.shutdown(10 * time.Second)
	if k.languageInfo != nil {
		nb.Metadata["language_info"] = k.languageInfo
	}
	r := &runner{k: k, nb: nb, o: &o}
	for i, c := range nb.Cells {
		if !c.runnable() {
			continue
		}
		t0 := time.Now()
		cerr, err := r.execute(ctx, i, c)
		res.Ran++
		var reported error
		if cerr != nil && c.tagged("raises-exception") && cerr.Timeout == 0 {
			// The cell is meant to fail: its error is in its outputs, and the run goes on.
			cerr = nil
		}
		if cerr != nil {
			res.Failed = append(res.Failed, cerr)
			reported = cerr
		} else if err != nil {
			reported = err
		}
		if o.OnCell != nil {
			o.OnCell(i+1, c, time.Since(t0), reported)
		}
		if err != nil {
			res.Elapsed = time.Since(start)
			return res, err
		}
		if cerr != nil && (!o.AllowErrors || cerr.Timeout > 0) {
			res.Elapsed = time.Since(start)
			return res, cerr
		}
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// runner executes cells and applies their iopub messages to the notebook.
type runner struct {
	k  *kernelProc
	nb *Notebook
	o  *Options
}

// execute runs cell c (at index i) to its reply and idle status. It returns a *CellError for
// a cell that failed or timed out, and a plain error when the run cannot go on (the kernel
// exited, ctx ended).
func (r *runner) execute(ctx context.Context, i int, c *Cell) (*CellError, error) {
	k := r.k
	id, err := k.send(k.shell, "execute_request", map[string]any{
		"code": c.Source, "silent": false, "store_history": true, "user_expressions": map[string]any{},
		"allow_stdin": false, "stop_on_error": !r.o.AllowErrors && !c.tagged("raises-exception"),
	})
	c.Timing = map[string]string{}
	if err != nil {
		return nil, err
	}
	cellErr := func() *CellError {
		first, _, _ := strings.Cut(strings.TrimSpace(c.Source), "\n")
		if len(first) > 60 {
			first = first[:60] + "..."
		}
		return &CellError{Index: i + 1, ID: c.ID, FirstLine: first}
	}
	var (
		reply       *executeReply
		idle        bool
		clearOnNext bool
		timedOut    bool // interrupted for running past the timeout
		deadline    <-chan time.Time
	)
	if r.o.Timeout > 0 {
		t := time.NewTimer(r.o.Timeout)
		defer t.Stop()
		deadline = t.C
	}
	for reply == nil || !idle {
		select {
		case m := <-k.iopubR:
			if p, _ := m.ParentHeader(); p.MsgID != id {
				continue
			}
			switch m.Header.MsgType {
			case "status":
				var s struct {
					State string `json:"execution_state"`
				}
				_ = json.Unmarshal(m.Content, &s)
				if s.State == "busy" || s.State == "idle" {
					c.Timing["iopub.status."+s.State] = m.Header.Date
				}
				idle = idle || s.State == "idle"
				continue
			case "execute_input":
				c.Timing["iopub.execute_input"] = m.Header.Date
				continue
			}
			r.apply(c, m, &clearOnNext)
		case m := <-k.shellR:
			if p, _ := m.ParentHeader(); p.MsgID != id || m.Header.MsgType != "execute_reply" {
				continue
			}
			reply = &executeReply{}
			c.Timing["shell.execute_reply"] = m.Header.Date
			if err := json.Unmarshal(m.Content, reply); err != nil {
				e := cellErr()
				e.Detail = fmt.Sprintf("the kernel's execute_reply is not readable: %v", err)
				return e, nil
			}
		case <-deadline:
			if timedOut {
				e := cellErr()
				e.Timeout = r.o.Timeout
				e.Detail = fmt.Sprintf("the kernel did not end the cell within %v of the interrupt, so it was stopped", r.o.InterruptWait)
				k.kill()
				return e, nil
			}
			// Interrupt the cell, and give the kernel InterruptWait to end it.
			timedOut = true
			if _, err := k.send(k.control, "interrupt_request", map[string]any{}); err != nil {
				return nil, err
			}
			t := time.NewTimer(r.o.InterruptWait)
			defer t.Stop()
			deadline = t.C
		case <-k.exited:
			if timedOut {
				e := cellErr()
				e.Timeout = r.o.Timeout
				e.Detail = k.exitError("after the interrupt").Error()
				return e, nil
			}
			return nil, k.exitError(fmt.Sprintf("while cell %d ran", i+1))
		case <-ctx.Done():
			_, _ = k.send(k.control, "interrupt_request", map[string]any{})
			return nil, fmt.Errorf("nbrun: cell %d: %w", i+1, ctx.Err())
		}
	}
	if reply.ExecutionCount != nil {
		n := *reply.ExecutionCount
		c.ExecutionCount = &n
	}
	if timedOut {
		e := cellErr()
		e.Timeout = r.o.Timeout
		e.Ename, e.Evalue = reply.Ename, reply.Evalue
		return e, nil
	}
	switch reply.Status {
	case "ok":
		return nil, nil
	case "error":
		e := cellErr()
		e.Ename, e.Evalue = reply.Ename, reply.Evalue
		return e, nil
	default:
		e := cellErr()
		e.Detail = fmt.Sprintf("the kernel answered %q", reply.Status)
		return e, nil
	}
}

type executeReply struct {
	Status         string `json:"status"`
	ExecutionCount *int   `json:"execution_count"`
	Ename          string `json:"ename"`
	Evalue         string `json:"evalue"`
}

// apply turns one iopub message of cell c's request into outputs.
func (r *runner) apply(c *Cell, m *wire.Message, clearOnNext *bool) {
	add := func(o *Output) {
		if *clearOnNext {
			c.Outputs = nil
			*clearOnNext = false
		}
		c.Outputs = append(c.Outputs, o)
	}
	switch m.Header.MsgType {
	case "stream":
		var s struct {
			Name string `json:"name"`
			Text string `json:"text"`
		}
		if json.Unmarshal(m.Content, &s) != nil || s.Name == "" {
			return
		}
		// Consecutive writes to one stream make one output, as Jupyter front-ends show them.
		if n := len(c.Outputs); n > 0 && !*clearOnNext && c.Outputs[n-1].Type == "stream" && c.Outputs[n-1].Name == s.Name {
			c.Outputs[n-1].Text += s.Text
			return
		}
		add(&Output{Type: "stream", Name: s.Name, Text: s.Text})
	case "display_data", "execute_result", "update_display_data":
		var d struct {
			Data           map[string]json.RawMessage `json:"data"`
			Metadata       json.RawMessage            `json:"metadata"`
			ExecutionCount int                        `json:"execution_count"`
			Transient      struct {
				DisplayID string `json:"display_id"`
			} `json:"transient"`
		}
		if json.Unmarshal(m.Content, &d) != nil {
			return
		}
		if d.Data == nil {
			d.Data = map[string]json.RawMessage{}
		}
		if m.Header.MsgType == "update_display_data" {
			// Every output showing the display, in any cell, takes the new bundle.
			for _, cc := range r.nb.Cells {
				for _, o := range cc.Outputs {
					if d.Transient.DisplayID != "" && o.displayID == d.Transient.DisplayID {
						o.Data, o.Metadata = d.Data, d.Metadata
					}
				}
			}
			return
		}
		add(&Output{Type: m.Header.MsgType, Data: d.Data, Metadata: d.Metadata,
			ExecutionCount: d.ExecutionCount, displayID: d.Transient.DisplayID})
	case "error":
		var e struct {
			Ename     string   `json:"ename"`
			Evalue    string   `json:"evalue"`
			Traceback []string `json:"traceback"`
		}
		if json.Unmarshal(m.Content, &e) != nil {
			return
		}
		add(&Output{Type: "error", Ename: e.Ename, Evalue: e.Evalue, Traceback: e.Traceback})
	case "clear_output":
		var w struct {
			Wait bool `json:"wait"`
		}
		_ = json.Unmarshal(m.Content, &w)
		if w.Wait {
			*clearOnNext = true
		} else {
			c.Outputs = nil
			*clearOnNext = false
		}
	}
}
