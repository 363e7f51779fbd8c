package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm/nccl"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/comm/tcp"
)

// rendezvousFlags are the multi-node flags shared by launch and `run rendezvous`; config
// combines them with the SLURM variables (flags win).
type rendezvousFlags struct {
	f rendezvous.Flags
}

// addRendezvousFlags registers --nnodes, --node-rank, --rendezvous, --rendezvous-bind,
// --rendezvous-token, --rendezvous-token-file and --rendezvous-timeout on fs.
func addRendezvousFlags(fs *pflag.FlagSet) *rendezvousFlags {
	rf := &rendezvousFlags{f: rendezvous.UnsetFlags()}
	fs.IntVar(&rf.f.NNodes, "nnodes", 0, "number of nodes (processes) in the run; default SLURM_NNODES, else 1")
	fs.IntVar(&rf.f.NodeRank, "node-rank", -1, "this node's rank, 0..nnodes-1 (node 0 runs the rendezvous); default SLURM_NODEID or SLURM_PROCID, else 0")
	fs.StringVar(&rf.f.Rendezvous, "rendezvous", "", "HOST:PORT of node 0's rendezvous; default "+rendezvous.EnvAddr+", else the first host of SLURM_JOB_NODELIST on port "+fmt.Sprint(rendezvous.DefaultPort))
	fs.StringVar(&rf.f.Bind, "rendezvous-bind", "", "address node 0 listens on (default: every interface, the port of --rendezvous)")
	fs.StringVar(&rf.f.Token, "rendezvous-token", "", "shared secret of every node (prefer --rendezvous-token-file or "+rendezvous.EnvToken+": flags show in ps)")
	fs.StringVar(&rf.f.TokenFile, "rendezvous-token-file", "", "file holding the shared secret (or "+rendezvous.EnvTokenFile+")")
	fs.DurationVar(&rf.f.Timeout, "rendezvous-timeout", 0, fmt.Sprintf("how long to wait for every node (default %v)", rendezvous.DefaultTimeout))
	return rf
}

// config resolves the flags and the environment into one rendezvous config.
func (rf *rendezvousFlags) config() (rendezvous.Config, error) {
	return rendezvous.ResolveConfig(rf.f, nil)
}

// rendezvousArg consumes one argument of a command that parses its own flags (launch, whose
// other "--key=value" arguments are config overrides): it reports whether a was one of the
// multi-node flags (only the --flag=value form) and stores its value in f.
func rendezvousArg(a string, f *rendezvous.Flags) (bool, error) {
	name, val, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
	if !strings.HasPrefix(a, "--") {
		return false, nil
	}
	known := map[string]bool{"nnodes": true, "node-rank": true, "rendezvous": true, "rendezvous-bind": true,
		"rendezvous-token": true, "rendezvous-token-file": true, "rendezvous-timeout": true}
	if !known[name] {
		return false, nil
	}
	if !ok {
		return true, fmt.Errorf("write --%s=VALUE", name)
	}
	num := func() (int, error) {
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("--%s=%q: want a non-negative integer", name, val)
		}
		return n, nil
	}
	var err error
	switch name {
	case "nnodes":
		f.NNodes, err = num()
		if err == nil && f.NNodes == 0 {
			err = fmt.Errorf("--nnodes=0: want 1 or more")
		}
	case "node-rank":
		f.NodeRank, err = num()
	case "rendezvous":
		f.Rendezvous = val
	case "rendezvous-bind":
		f.Bind = val
	case "rendezvous-token":
		f.Token = val
	case "rendezvous-token-file":
		f.TokenFile = val
	case "rendezvous-timeout":
		f.Timeout, err = time.ParseDuration(val)
		if err != nil || f.Timeout <= 0 {
			err = fmt.Errorf("--rendezvous-timeout=%q: want a positive duration such as 90s or 5m", val)
		}
	}
	return true, err
}

// joinWorld runs the rendezvous for a run that uses NCCL on its GPUs: node 0 makes the NCCL
// unique id and the rendezvous carries it to every node. devices is this node's GPU count.
func joinWorld(ctx context.Context, cfg rendezvous.Config, devices int) (rendezvous.World, nccl.UniqueID, error) {
	var id nccl.UniqueID
	var payload []byte
	if cfg.NodeRank == 0 {
		var err error
		if id, err = nccl.NewUniqueID(); err != nil {
			return rendezvous.World{}, id, err
		}
		payload = id.Internal[:]
	}
	w, err := rendezvous.Join(ctx, cfg, devices, payload)
	if err != nil {
		return w, id, err
	}
	if len(w.Payload) != nccl.UniqueIDBytes {
		return w, id, fmt.Errorf("rendezvous: node 0 sent %d bytes of NCCL id, want %d", len(w.Payload), nccl.UniqueIDBytes)
	}
	copy(id.Internal[:], w.Payload)
	return w, id, nil
}

func init() {
	var devices int
	var withNCCL, withTCP bool
	var tcpListen string
	cmd := &cobra.Command{
		Use:   "rendezvous",
		Short: "Join the nodes of a multi-node run and print the world they agree on",
		Long: `Runs the rendezvous that a multi-node launch runs first, and nothing else: node 0 listens,
the other nodes connect with the shared token, and every node prints the same world (node ranks,
hosts, device counts) as JSON. Use it to check addresses, ports, tokens and firewalls before a
long run. Flags override the SLURM variables (SLURM_NNODES, SLURM_NODEID, SLURM_PROCID,
SLURM_JOB_NODELIST). With --nccl, node 0 also makes an NCCL unique id and every node checks
that it arrived. With --tcp, the nodes then connect to each other as a world of one CPU rank
each (the communicator multi-process CPU runs use), check an all-reduce and report its
bandwidth between them.`,
		Args: cobra.NoArgs,
	}
	rf := addRendezvousFlags(cmd.Flags())
	cmd.Flags().IntVar(&devices, "devices", -1, "devices this node reports (default: the GPUs the CUDA driver sees)")
	cmd.Flags().BoolVar(&withNCCL, "nccl", false, "carry an NCCL unique id from node 0 (needs libnccl.so.2 on node 0)")
	cmd.Flags().BoolVar(&withTCP, "tcp", false, "also connect the nodes to each other over TCP and time an all-reduce between them")
	cmd.Flags().StringVar(&tcpListen, "tcp-listen", "", "with --tcp: address this node accepts the other nodes on (default: every interface, a port the system picks)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := rf.config()
		if err != nil {
			return err
		}
		n := devices
		if n < 0 {
			n = cuda.DeviceCount()
		}
		start := time.Now()
		if withTCP {
			if withNCCL {
				return fmt.Errorf("rendezvous: --tcp and --nccl check different worlds: pass one of them")
			}
			res, err := joinTCP(cmd.Context(), tcp.Config{Rendezvous: cfg, Listen: tcpListen, Timeout: cfg.Timeout})
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(struct {
				NodeRank int               `json:"node_rank"`
				TCP      tcpCheck          `json:"tcp"`
				Seconds  float64           `json:"seconds"`
				Config   rendezvousSummary `json:"config"`
			}{cfg.NodeRank, res, time.Since(start).Seconds(), summarize(cfg)})
		}
		var w rendezvous.World
		if withNCCL {
			w, _, err = joinWorld(cmd.Context(), cfg, n)
		} else {
			w, err = rendezvous.Join(cmd.Context(), cfg, n, nil)
		}
		if err != nil {
			return err
		}
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			NodeRank  int               `json:"node_rank"`
			Nodes     []rendezvous.Node `json:"nodes"`
			Devices   int               `json:"devices"`
			FirstRank int               `json:"first_rank"`
			Payload   int               `json:"payload_bytes"`
			Seconds   float64           `json:"seconds"`
			Config    rendezvousSummary `json:"config"`
		}{cfg.NodeRank, w.Nodes, w.Devices(), w.FirstRank(cfg.NodeRank), len(w.Payload), time.Since(start).Seconds(), summarize(cfg)})
	}
	runCmd.AddCommand(cmd)
}

// rendezvousSummary is the config without its secret.
type rendezvousSummary struct {
	NNodes  int    `json:"nnodes"`
	Addr    string `json:"rendezvous,omitempty"`
	Timeout string `json:"timeout"`
}

func summarize(c rendezvous.Config) rendezvousSummary {
	t := c.Timeout
	if t <= 0 {
		t = rendezvous.DefaultTimeout
	}
	return rendezvousSummary{NNodes: c.NNodes, Addr: c.Addr, Timeout: t.String()}
}
