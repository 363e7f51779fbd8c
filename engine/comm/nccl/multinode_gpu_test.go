package nccl

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// A test binary started with HALO_NCCL_NODE=RANK is one node of a two-node world on one host
// (each node sees one GPU through CUDA_VISIBLE_DEVICES): it joins the rendezvous, builds its NCCL
// communicator from node 0's unique id and all-reduces rank+1; it prints the sum it got.
func TestMain(m *testing.M) {
	if r := os.Getenv("HALO_NCCL_NODE"); r != "" {
		if err := nodeMain(r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func nodeMain(rank string) error {
	r, _ := strconv.Atoi(rank)
	cfg := rendezvous.Config{NNodes: 2, NodeRank: r, Addr: os.Getenv("HALO_NCCL_ADDR"), Bind: os.Getenv("HALO_NCCL_ADDR"), Token: "test", Timeout: 60 * time.Second}
	var payload []byte
	if r == 0 {
		id, err := NewUniqueID()
		if err != nil {
			return err
		}
		payload = id.Internal[:]
	}
	w, err := rendezvous.Join(context.Background(), cfg, 1, payload)
	if err != nil {
		return err
	}
	var id UniqueID
	copy(id.Internal[:], w.Payload)
	b, err := cuda.New(0)
	if err != nil {
		return err
	}
	defer b.Close()
	world, err := NewNodeWorld([]*cuda.Backend{b}, id, w.Devices(), w.FirstRank(r))
	if err != nil {
		return err
	}
	defer world.Close()
	v := make([]float32, 1000)
	for i := range v {
		v[i] = float32(r + 1)
	}
	t, err := upload(b, tensor.F32, v, len(v))
	if err != nil {
		return err
	}
	if err := world.Comm(0).AllReduce(t, comm.Sum); err != nil {
		return err
	}
	raw, err := download(b, t)
	if err != nil {
		return err
	}
	got, _ := tensor.DecodeFloat32(tensor.F32, raw)
	fmt.Printf("rank %d sum %g %g\n", world.Comm(0).Rank(), got[0], got[len(got)-1])
	return nil
}

func TestGPUTwoProcessesJoinOneWorld(t *testing.T) {
	gpusOrSkip(t, 2) // says why when there are fewer than two GPUs
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	outs := make([]bytes.Buffer, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "HALO_NCCL_NODE="+strconv.Itoa(r), "HALO_NCCL_ADDR="+addr, "CUDA_VISIBLE_DEVICES="+strconv.Itoa(r))
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = cmd.Wait() }()
	}
	wg.Wait()
	for r := 0; r < 2; r++ {
		if errs[r] != nil {
			t.Fatalf("node %d: %v\n%s", r, errs[r], outs[r].String())
		}
		if want := fmt.Sprintf("rank %d sum 3 3", r); !strings.Contains(outs[r].String(), want) {
			t.Fatalf("node %d printed %q, want %q", r, outs[r].String(), want)
		}
	}
}
