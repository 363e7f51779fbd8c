package session

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"connectrpc.com/connect/v2/connectproto"

	"github.com/halo-shell/halo-shell/internal/switches"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
	"github.com/halo-shell/halo-shell/session/proto/halo/v1/halov1connect"
)

// Message types of the API, re-exported so that clients need not import the generated package.
type (
	StepMetrics       = halov1.StepMetrics
	StepProfile       = halov1.StepProfile
	DeviceMemory      = halov1.DeviceMemory
	ExpertLoad        = halov1.ExpertLoad
	StatusResponse    = halov1.StatusResponse
	Hyper             = halov1.Hyper
	SetHyperRequest   = halov1.SetHyperRequest
	SetLayoutResponse = halov1.SetLayoutResponse
	InspectRequest    = halov1.InspectRequest
	InspectResponse   = halov1.InspectResponse
	TensorStats       = halov1.TensorStats
	GenerateRequest   = halov1.GenerateRequest
	LoadRequest       = halov1.LoadRequest
	ProfileResponse   = halov1.ProfileResponse
	MeasureRequest    = halov1.MeasureRequest
	MeasureResponse   = halov1.MeasureResponse
	Event             = halov1.Event
	State             = halov1.State
)

// Session states (see the package doc).
const (
	StateEmpty    = halov1.State_STATE_EMPTY
	StateIdle     = halov1.State_STATE_IDLE
	StateRunning  = halov1.State_STATE_RUNNING
	StatePaused   = halov1.State_STATE_PAUSED
	StateStopping = halov1.State_STATE_STOPPING
)

// Header names the client sends.
const (
	HeaderClientID   = "Halo-Client-Id"
	HeaderClientName = "Halo-Client-Name"
)

// Options configure a Client.
type Options struct {
	// ClientID identifies this client to the session (who controls it). Empty means a random
	// id; reuse an id to keep control across reconnects.
	ClientID string
	// ClientName is a human-readable label shown in Status (e.g. "repl", "tui").
	ClientName string
	// Token is the bearer token for tcp:// targets. Empty means: read it from the token file
	// of the session named by TokenSession (or DefaultName) in RuntimeDir.
	Token string
	// TokenSession names the session whose token file is read for tcp:// targets.
	TokenSession string
	// DialTimeout bounds connecting (default 5 s).
	DialTimeout time.Duration
	// CAFile, a PEM file, makes a tcp:// target a TLS connection verified against these
	// certificate authorities (a session started with --tls-cert). Empty means
	// HALO_SESSION_CA, and plaintext when that is unset too.
	CAFile string
}

var swSessionCA = switches.Register(switches.Switch{Name: "HALO_SESSION_CA", Kind: switches.Path,
	Doc: "PEM file of the certificate authority of a session served with --tls-cert: clients dialling tcp://HOST:PORT then speak TLS and verify the session against it."})

// tlsClientConfig reads the CA file of a TLS target; nil without one.
func tlsClientConfig(caFile, host string) (*tls.Config, error) {
	if caFile == "" {
		caFile = swSessionCA.Value()
	}
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("session: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("session: CA file %s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}, nil
}

// maxResponseBytes bounds a reply (Inspect values and profile traces are the largest).
const maxResponseBytes = 256 << 20

// Client is a connection to one session. Its methods may be called from any goroutine.
type Client struct {
	target string
	id     string
	name   string
	http   *http.Client
	rpc    halov1connect.SessionServiceClient

	// The control lease (see holdLease): renewing is set while a renewer runs; lmu
	// serialises starting and stopping it with its renewals.
	renewing  atomic.Bool
	lmu       sync.Mutex
	leaseStop chan struct{}
	closed    bool
}

// LeaseRenewEvery is how often a client that controls a session renews its control lease. A
// session releases control from a client that has no call or stream in progress and has not
// renewed within its lease (HALO_CONTROL_LEASE on the session's side, 6 s by default), so
// control passes on within seconds when its holder is killed.
const LeaseRenewEvery = 2 * time.Second

// holdLease starts renewing the control lease after a control call that may have made this
// client the controller (every error but a refusal or an unreachable session).
func (c *Client) holdLease(err error) {
	if err != nil && (IsNotController(err) || IsUnavailable(err) || connect.CodeOf(err) == connect.CodeUnauthenticated) {
		return
	}
	if c.renewing.Load() {
		return
	}
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if c.closed || c.renewing.Load() {
		return
	}
	c.renewing.Store(true)
	c.leaseStop = make(chan struct{})
	go c.renew(c.leaseStop)
}

// renew claims control every LeaseRenewEvery (a claim by the controller only renews its
// lease) until stop is closed or another client controls the session.
func (c *Client) renew(stop chan struct{}) {
	t := time.NewTicker(LeaseRenewEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		c.lmu.Lock()
		select {
		case <-stop:
			c.lmu.Unlock()
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), LeaseRenewEvery)
		_, err := c.rpc.Control(ctx, &halov1.ControlRequest{Action: halov1.ControlAction_CONTROL_ACTION_CLAIM, ClientName: c.name})
		cancel()
		if IsNotController(err) {
			c.stopLeaseLocked()
			c.lmu.Unlock()
			return
		}
		c.lmu.Unlock()
	}
}

// stopLeaseLocked stops the renewer; a renewal in progress has ended (it holds lmu).
func (c *Client) stopLeaseLocked() {
	if c.renewing.Load() {
		close(c.leaseStop)
		c.renewing.Store(false)
	}
}

// NewClientID returns a random client id.
func NewClientID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Dial connects to a session. target is a session name ("default", "exp1"), a unix socket path
// (absolute, or "unix:///path"), or "tcp://HOST:PORT" (which needs the bearer token). Dial does
// not contact the session; use Ping (or any call) to check it answers.
func Dial(target string, o Options) (*Client, error) {
	if target == "" {
		target = DefaultName
	}
	if o.ClientID == "" {
		o.ClientID = NewClientID()
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	var (
		dial    func(ctx context.Context) (net.Conn, error)
		baseURL = "http://halo-session"
		token   = o.Token
		tlsConf *tls.Config
	)
	d := net.Dialer{Timeout: o.DialTimeout}
	switch {
	case strings.HasPrefix(target, "tcp://"):
		addr := strings.TrimPrefix(target, "tcp://")
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("session: target %q: want tcp://HOST:PORT: %v", target, err)
		}
		if tlsConf, err = tlsClientConfig(o.CAFile, host); err != nil {
			return nil, err
		}
		if token == "" {
			name := o.TokenSession
			if name == "" {
				name = DefaultName
			}
			p, err := PathsFor(name)
			if err != nil {
				return nil, err
			}
			b, err := os.ReadFile(p.Token)
			if err != nil {
				return nil, fmt.Errorf("session: target %s needs a bearer token: pass Options.Token or copy the session's token file (%w)", target, err)
			}
			token = strings.TrimSpace(string(b))
		}
		dial = func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	default:
		sock := strings.TrimPrefix(target, "unix://")
		if !strings.Contains(sock, "/") {
			p, err := PathsFor(sock)
			if err != nil {
				return nil, err
			}
			sock = p.Socket
		}
		dial = func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) }
	}
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols: protos,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		MaxIdleConns: 4,
	}
	if tlsConf != nil {
		tp := new(http.Protocols)
		tp.SetHTTP2(true)
		tr.Protocols, tr.TLSClientConfig = tp, tlsConf
		tr.ForceAttemptHTTP2 = true
		baseURL = "https://" + strings.TrimPrefix(target, "tcp://")
	}
	hc := &http.Client{Transport: tr}
	c := &Client{target: target, id: o.ClientID, name: o.ClientName, http: hc}
	auth := func(next connect.ClientFunc) connect.ClientFunc {
		return func(ctx context.Context, spec connect.Spec) (connect.ClientStream, error) {
			if info, ok := connect.CallInfoForClientContext(ctx); ok {
				h := info.RequestHeader()
				h.Set(HeaderClientID, c.id)
				if c.name != "" {
					h.Set(HeaderClientName, c.name)
				}
				if token != "" {
					h.Set("Authorization", "Bearer "+token)
				}
			}
			return next(ctx, spec)
		}
	}
	c.rpc = halov1connect.NewSessionServiceClient(connect.NewClient(connecthttp.NewTransport(hc, baseURL, connecthttp.WithReadMaxBytes(maxResponseBytes)), auth))
	return c, nil
}

// ID is the client id this client sends.
func (c *Client) ID() string { return c.id }

// Target is what the client was dialled with.
func (c *Client) Target() string { return c.target }

// Close releases the client's connections and stops renewing its control lease, so that
// control passes on within the session's lease unless Release gives it up at once.
func (c *Client) Close() error {
	c.lmu.Lock()
	c.closed = true
	c.stopLeaseLocked()
	c.lmu.Unlock()
	c.http.CloseIdleConnections()
	return nil
}

// Ping checks that the session answers (a Status call).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Status(ctx)
	return err
}

// Load builds a trainer from a config file on the session's machine (method "sft" or
// "pretrain"; overrides are --key=value strings) and replaces any loaded model. Over a unix
// socket a relative configPath is made absolute against this process's directory; relative
// paths inside the config resolve against the session's working directory, else against the
// config file's directory. A loaded model with steps not saved since it was loaded or last
// saved is not replaced (failed_precondition) unless the request forces it (LoadWith).
func (c *Client) Load(ctx context.Context, configPath, method string, overrides ...string) (*halov1.LoadResponse, error) {
	return c.LoadWith(ctx, &halov1.LoadRequest{ConfigPath: configPath, Method: method, Overrides: overrides})
}

// LoadYAML is Load with the config given inline.
func (c *Client) LoadYAML(ctx context.Context, yaml, method string, overrides ...string) (*halov1.LoadResponse, error) {
	return c.LoadWith(ctx, &halov1.LoadRequest{ConfigYaml: yaml, Method: method, Overrides: overrides})
}

// LoadWith is Load with every field of the request (Force replaces unsaved steps).
func (c *Client) LoadWith(ctx context.Context, req *LoadRequest) (*halov1.LoadResponse, error) {
	if !strings.HasPrefix(c.target, "tcp://") && req.ConfigPath != "" {
		// Same machine: a relative path means the caller's directory, not the session's.
		if abs, err := filepath.Abs(req.ConfigPath); err == nil {
			req.ConfigPath = abs
		}
	}
	r, err := c.rpc.Load(ctx, req)
	c.holdLease(err)
	return r, err
}

// Step runs n optimizer steps and returns their metrics. When ctx ends (or this process dies)
// the steps stop at the next step boundary; Pause from the controller also ends them early,
// and then fewer than n metrics come back.
func (c *Client) Step(ctx context.Context, n int) ([]*StepMetrics, error) {
	r, err := c.rpc.Step(ctx, &halov1.StepRequest{N: int32(n)})
	c.holdLease(err)
	if err != nil {
		return nil, err
	}
	return r.Metrics, nil
}

// Run starts training in the background for maxSteps steps (0: until the planned total) and
// returns at once; follow it with Events.
func (c *Client) Run(ctx context.Context, maxSteps int) (*StatusResponse, error) {
	r, err := c.rpc.Run(ctx, &halov1.RunRequest{MaxSteps: int64(maxSteps)})
	c.holdLease(err)
	if err != nil {
		return nil, err
	}
	return r.Status, nil
}

// Pause stops a run at the next step boundary; it returns once the run has stopped.
func (c *Client) Pause(ctx context.Context) (*StatusResponse, error) {
	r, err := c.rpc.Pause(ctx, &halov1.PauseRequest{})
	c.holdLease(err)
	if err != nil {
		return nil, err
	}
	return r.Status, nil
}

// Resume continues a paused run.
func (c *Client) Resume(ctx context.Context) (*StatusResponse, error) {
	r, err := c.rpc.Resume(ctx, &halov1.ResumeRequest{})
	c.holdLease(err)
	if err != nil {
		return nil, err
	}
	return r.Status, nil
}

// Eval returns the held-out loss.
func (c *Client) Eval(ctx context.Context) (float64, error) {
	r, err := c.rpc.Eval(ctx, &halov1.EvalRequest{})
	c.holdLease(err)
	if err != nil {
		return 0, err
	}
	return r.Loss, nil
}

// Generate continues req.Prompt and returns the generated text; onPiece, when not nil,
// receives each piece of text as it is produced.
func (c *Client) Generate(ctx context.Context, req *GenerateRequest, onPiece func(string)) (string, error) {
	s, _, err := c.GenerateCount(ctx, req, onPiece)
	return s, err
}

// GenerateCount is Generate that also returns the number of new tokens the session generated.
func (c *Client) GenerateCount(ctx context.Context, req *GenerateRequest, onPiece func(string)) (string, int, error) {
	st, err := c.rpc.Generate(ctx, req)
	if err != nil {
		return "", 0, err
	}
	defer st.Close()
	var b strings.Builder
	tokens := 0
	for first := true; ; first = false {
		m, err := st.Receive()
		if first {
			c.holdLease(err)
		}
		if errors.Is(err, io.EOF) {
			return b.String(), tokens, nil
		}
		if err != nil {
			return b.String(), tokens, err
		}
		tokens = max(tokens, int(m.Tokens))
		b.WriteString(m.Text)
		if onPiece != nil && m.Text != "" {
			onPiece(m.Text)
		}
	}
}

// Save writes a checkpoint into dir (on the session's machine).
func (c *Client) Save(ctx context.Context, dir string) (*halov1.SaveResponse, error) {
	r, err := c.rpc.Save(ctx, &halov1.SaveRequest{Dir: dir})
	c.holdLease(err)
	return r, err
}

// Hyper returns the hyperparameters the next step will use.
func (c *Client) Hyper(ctx context.Context) (*Hyper, error) {
	return c.rpc.GetHyper(ctx, &halov1.GetHyperRequest{})
}

// SetHyper changes the fields of req that are set, from the next step on, and returns the
// resulting hyperparameters. Invalid values are refused and nothing changes.
func (c *Client) SetHyper(ctx context.Context, req *SetHyperRequest) (*Hyper, error) {
	r, err := c.rpc.SetHyper(ctx, req)
	c.holdLease(err)
	return r, err
}

// SetLR sets the peak learning rate from the next step on.
func (c *Client) SetLR(ctx context.Context, lr float64) (*Hyper, error) {
	return c.SetHyper(ctx, &halov1.SetHyperRequest{LearningRate: &lr})
}

// Inspect returns tensor statistics and optionally a slice of one tensor (see InspectRequest).
func (c *Client) Inspect(ctx context.Context, req *InspectRequest) (*InspectResponse, error) {
	r, err := c.rpc.Inspect(ctx, req)
	if req.Activations {
		c.holdLease(err)
	}
	return r, err
}

// Profile runs the next k steps with profiling on and returns their breakdowns (and a
// Chrome/Perfetto trace when trace is set). While a run is going, it observes the run's next k
// steps instead of running its own.
//
// Each breakdown splits the step's wall time into compute by op class (ComputeS: matmul,
// attention, norm, rope, embedding, mlp_activation, loss, optimizer, other), communication
// by collective kind (CommS, empty on one device) and HostS (host work and idle); they add up
// to StepS.
func (c *Client) Profile(ctx context.Context, k int, trace bool) (*ProfileResponse, error) {
	r, err := c.rpc.Profile(ctx, &halov1.ProfileRequest{Steps: int32(k), Trace: trace})
	c.holdLease(err)
	return r, err
}

// Measure times one op on the session's device (see halo.v1 MeasureRequest for the ops and
// their sizes) and returns the per-op times with the work they did. It is a control call: the
// measurement occupies the device, at a step boundary of a run.
func (c *Client) Measure(ctx context.Context, req *MeasureRequest) (*MeasureResponse, error) {
	r, err := c.rpc.Measure(ctx, req)
	c.holdLease(err)
	return r, err
}

// SetLayout moves the run to another parallel layout at the next step boundary and reports
// the new layout and how long the move took. layout is layout words with an optional
// devices=LIST ("tp=2 fsdp devices=cpu:4"); internal/layoutspec.CheckSpec checks their syntax
// before sending, and the session refuses a layout that does not suit the model or devices.
func (c *Client) SetLayout(ctx context.Context, layout string) (*SetLayoutResponse, error) {
	r, err := c.rpc.SetLayout(ctx, &halov1.SetLayoutRequest{Layout: layout})
	c.holdLease(err)
	return r, err
}

// Status describes the session.
func (c *Client) Status(ctx context.Context) (*StatusResponse, error) {
	return c.rpc.Status(ctx, &halov1.StatusRequest{})
}

// Claim makes this client the controller if nobody is; it fails with failed_precondition
// naming the controller otherwise.
func (c *Client) Claim(ctx context.Context) error {
	_, err := c.rpc.Control(ctx, &halov1.ControlRequest{Action: halov1.ControlAction_CONTROL_ACTION_CLAIM, ClientName: c.name})
	if err == nil {
		c.holdLease(nil)
	}
	return err
}

// TakeOver makes this client the controller even if another client is; it returns the id of
// the previous controller ("" when none).
func (c *Client) TakeOver(ctx context.Context) (string, error) {
	r, err := c.rpc.Control(ctx, &halov1.ControlRequest{Action: halov1.ControlAction_CONTROL_ACTION_TAKE_OVER, ClientName: c.name})
	if err != nil {
		return "", err
	}
	c.holdLease(nil)
	return r.Previous, nil
}

// Release gives up control (a no-op when this client is not the controller).
func (c *Client) Release(ctx context.Context) error {
	c.lmu.Lock()
	c.stopLeaseLocked()
	c.lmu.Unlock()
	_, err := c.rpc.Control(ctx, &halov1.ControlRequest{Action: halov1.ControlAction_CONTROL_ACTION_RELEASE, ClientName: c.name})
	return err
}

// EventStream is a subscription to a session's events.
type EventStream struct {
	st   halov1connect.SessionServiceEventsClientStream
	once sync.Once
}

// Subscribe opens an event stream; buffer is how many events the session keeps for this
// observer before dropping the oldest (0: 256). Cancel ctx or call Close to end it.
func (c *Client) Subscribe(ctx context.Context, buffer int) (*EventStream, error) {
	return c.SubscribeWithHistory(ctx, buffer, 0)
}

// SubscribeWithHistory is Subscribe that first receives, after the state event, up to history
// of the latest steps' metrics of the loaded model, oldest first (the session keeps 4096).
func (c *Client) SubscribeWithHistory(ctx context.Context, buffer, history int) (*EventStream, error) {
	st, err := c.rpc.Events(ctx, &halov1.EventsRequest{Buffer: int32(buffer), History: int32(history)})
	if err != nil {
		return nil, err
	}
	return &EventStream{st: st}, nil
}

// Recv returns the next event; io.EOF when the session ended the stream.
func (s *EventStream) Recv() (*Event, error) { return s.st.Receive() }

// Close ends the subscription.
func (s *EventStream) Close() error {
	var err error
	s.once.Do(func() { err = s.st.Close() })
	return err
}

// Events subscribes and delivers events on a channel, which is closed when ctx ends or the
// stream fails; the error that ended it (nil after ctx ends) is then available from the
// returned function. The channel is unbuffered: the session drops the oldest events (and says
// so with a DroppedEvent) when the reader falls behind, never the other way round.
func (c *Client) Events(ctx context.Context, buffer int) (<-chan *Event, func() error, error) {
	return c.EventsWithHistory(ctx, buffer, 0)
}

// EventsWithHistory is Events preceded by up to history of the latest steps' metrics (see
// SubscribeWithHistory): what a dashboard that attaches to a running session charts first.
func (c *Client) EventsWithHistory(ctx context.Context, buffer, history int) (<-chan *Event, func() error, error) {
	st, err := c.SubscribeWithHistory(ctx, buffer, history)
	if err != nil {
		return nil, nil, err
	}
	ch := make(chan *Event)
	var (
		mu   sync.Mutex
		last error
	)
	go func() {
		defer close(ch)
		defer st.Close()
		for {
			ev, err := st.Recv()
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, io.EOF) {
					mu.Lock()
					last = err
					mu.Unlock()
				}
				return
			}
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, func() error { mu.Lock(); defer mu.Unlock(); return last }, nil
}

// IsNotController reports whether err is the refusal of a control call from a client that does
// not control the session (code failed_precondition with a NotController detail; other
// failed_precondition errors, such as "a run is in progress", are not).
func IsNotController(err error) bool {
	_, ok := NotControllerOf(err)
	return ok
}

// NotControllerOf returns who controls the session when err is the refusal of a control call.
func NotControllerOf(err error) (*halov1.NotController, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition {
		return nil, false
	}
	for _, d := range ce.Details() {
		if d.Type != "halo.v1.NotController" {
			continue
		}
		if m, err := connectproto.UnmarshalErrorDetail(d); err == nil {
			if nc, ok := m.(*halov1.NotController); ok {
				return nc, true
			}
		}
	}
	return nil, false
}

// IsUnavailable reports whether err means the session could not be reached.
func IsUnavailable(err error) bool {
	return connect.CodeOf(err) == connect.CodeUnavailable
}
