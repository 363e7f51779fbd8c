package tui

import (
	"context"
	"errors"
	"fmt"
	"io"

	tea "charm.land/bubbletea/v2"

	"github.com/halo-shell/halo-shell/session"
)

// RunOptions say which session to attach to and how.
type RunOptions struct {
	// Session is a session name, a socket path or tcp://HOST:PORT (default: the default
	// session).
	Session string
	// NoStart attaches only to a running session; by default the default session is started
	// when none answers (session.DialOrStart).
	NoStart bool
	// Client overrides the session.Options of the connection (ClientName defaults to "tui").
	Client session.Options
	// Start says how to start a session when one is started.
	Start session.StartOptions
	// Model configures the dashboard.
	Model Options
	// Input and Output replace the terminal (tests); nil means stdin and stdout.
	Input  io.Reader
	Output io.Writer
}

// Run attaches a dashboard to a session and runs it until the user detaches or ctx ends.
// Detaching never stops the session.
func Run(ctx context.Context, o RunOptions) error {
	if o.Client.ClientName == "" {
		o.Client.ClientName = "tui"
	}
	var (
		c   *session.Client
		err error
	)
	if o.NoStart {
		c, err = session.Dial(o.Session, o.Client)
		if err == nil {
			err = c.Ping(ctx)
		}
	} else {
		c, err = session.DialOrStart(ctx, o.Session, o.Client, o.Start)
	}
	if err != nil {
		name := o.Session
		if name == "" {
			name = session.DefaultName
		}
		if o.NoStart && session.IsUnavailable(err) {
			return fmt.Errorf("tui: session %s does not answer (%w): start it with `halo-shell session start --name %s`, or attach without --no-start", name, err, name)
		}
		return fmt.Errorf("tui: attaching to session %s: %w", name, err)
	}
	defer c.Close()
	m := New(c, o.Model)
	opts := []tea.ProgramOption{tea.WithContext(ctx)}
	if o.Input != nil {
		opts = append(opts, tea.WithInput(o.Input))
	}
	if o.Output != nil {
		opts = append(opts, tea.WithOutput(o.Output))
	}
	_, err = tea.NewProgram(m, opts...).Run()
	m.cancel()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return nil
	}
	return err
}
