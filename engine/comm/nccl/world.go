package nccl

import (
	"errors"
	"fmt"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm"
)

// World is the set of this process's ranks of one NCCL world: one communicator per local GPU
// over every rank of every node, plus the sub-group communicators Split made.
type World struct {
	api       *api
	backends  []*cuda.Backend
	size      int // ranks over every node
	first     int // global rank of backends[0]
	world     []*Comm
	mu        sync.Mutex
	subgroups [][]*Comm
}

// NewLocalWorld makes a world of the local GPUs only: rank i drives backends[i]. It works with one
// GPU (a one-rank communicator).
func NewLocalWorld(backends []*cuda.Backend) (*World, error) {
	if len(backends) == 0 {
		return nil, errors.New("nccl: NewLocalWorld needs at least one GPU backend")
	}
	id, err := NewUniqueID()
	if err != nil {
		return nil, err
	}
	return NewNodeWorld(backends, id, len(backends), 0)
}

// NewNodeWorld joins this node's GPUs to a world of size ranks named by id: backends[i] becomes
// global rank first+i. Every node calls it with the same id and size (node 0 made the id; the
// rendezvous carried it) and its own first rank (rendezvous.World.FirstRank). It returns once
// every rank of every node has joined.
func NewNodeWorld(backends []*cuda.Backend, id UniqueID, size, first int) (*World, error) {
	if len(backends) == 0 {
		return nil, errors.New("nccl: NewNodeWorld needs at least one GPU backend")
	}
	if size < 1 || first < 0 || first+len(backends) > size {
		return nil, fmt.Errorf("nccl: ranks %d..%d of this node do not fit a world of %d ranks", first, first+len(backends)-1, size)
	}
	seen := map[string]int{}
	for i, b := range backends {
		if b == nil {
			return nil, fmt.Errorf("nccl: backend of local rank %d is nil", i)
		}
		if j, dup := seen[b.Name()]; dup {
			return nil, fmt.Errorf("nccl: local ranks %d and %d both drive %s; NCCL needs one GPU per rank", j, i, b.Name())
		}
		seen[b.Name()] = i
	}
	a, err := prepare()
	if err != nil {
		return nil, err
	}
	w := &World{api: a, backends: backends, size: size, first: first}
	w.world, err = w.each(func(i int) (*Comm, error) {
		return initRank(a, backends[i], id, size, first+i, "world")
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// each runs f for every local rank concurrently (NCCL's init and split calls block until every
// rank has called them) and returns the communicators, or every error; on error it aborts the
// communicators that were made.
func (w *World) each(f func(i int) (*Comm, error)) ([]*Comm, error) {
	out := make([]*Comm, len(w.backends))
	errs := make([]error, len(w.backends))
	var wg sync.WaitGroup
	for i := range w.backends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = f(i)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range out {
			if c != nil {
				c.Abort()
			}
		}
		return nil, err
	}
	return out, nil
}

// Size is the number of ranks over every node.
func (w *World) Size() int { return w.size }

// Local is the number of this process's ranks.
func (w *World) Local() int { return len(w.backends) }

// FirstRank is the global rank of local rank 0.
func (w *World) FirstRank() int { return w.first }

// Comm returns local rank i's communicator over the whole world (global rank FirstRank()+i).
func (w *World) Comm(i int) *Comm { return w.world[i] }

// Split makes sub-groups as comm.World.Split does: groups partitions the global ranks (every
// rank in exactly one group) and group i is named name+i with the rank order of its list. The
// result is indexed by local rank. Every node must call Split with the same groups, and every
// local rank takes part (ncclCommSplit is collective over the world).
func (w *World) Split(name string, groups [][]int) ([]*Comm, error) {
	color := make([]int, w.size)
	key := make([]int, w.size)
	for i := range color {
		color[i] = -1
	}
	for gi, g := range groups {
		if len(g) == 0 {
			return nil, fmt.Errorf("nccl: Split %q: group %d is empty", name, gi)
		}
		for pos, r := range g {
			if r < 0 || r >= w.size {
				return nil, fmt.Errorf("nccl: Split %q: group %d names rank %d; the world has ranks 0..%d", name, gi, r, w.size-1)
			}
			if color[r] >= 0 {
				return nil, fmt.Errorf("nccl: Split %q: rank %d is in more than one group", name, r)
			}
			color[r], key[r] = gi, pos
		}
	}
	for r, c := range color {
		if c < 0 {
			return nil, fmt.Errorf("nccl: Split %q: rank %d is in no group; every rank must be in exactly one", name, r)
		}
	}
	cs, err := w.each(func(i int) (*Comm, error) {
		parent := w.world[i]
		r := w.first + i
		g := groups[color[r]]
		c := &Comm{api: w.api, b: parent.b, rank: key[r], size: len(g), group: fmt.Sprintf("%s%d", name, color[r]), stats: comm.Stats{}}
		err := parent.b.Device().Do(func() error {
			return w.api.check("ncclCommSplit", w.api.ncclCommSplit(parent.h, int32(color[r]), int32(key[r]), &c.h, nil), parent.h)
		})
		if err == nil {
			if err = c.checkShape(len(g), key[r]); err != nil {
				c.Abort()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("nccl: Split %q: rank %d: %w", name, r, err)
		}
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.subgroups = append(w.subgroups, cs)
	w.mu.Unlock()
	return cs, nil
}

// Close destroys every communicator of the world, sub-groups first. The local ranks of a group
// are destroyed concurrently: NCCL's destroy is collective over the ranks of a node.
func (w *World) Close() error { return w.release((*Comm).Destroy) }

// Abort aborts every communicator of the world without waiting for other nodes.
func (w *World) Abort() error { return w.release((*Comm).Abort) }

func (w *World) release(f func(*Comm) error) error {
	w.mu.Lock()
	groups := append(w.subgroups, w.world)
	w.subgroups = nil
	w.mu.Unlock()
	var errs []error
	for _, g := range groups {
		ge := make([]error, len(g))
		var wg sync.WaitGroup
		for i, c := range g {
			if c == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ge[i] = f(c)
			}()
		}
		wg.Wait()
		errs = append(errs, ge...)
	}
	return errors.Join(errs...)
}
