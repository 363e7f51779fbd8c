package comm

import "errors"

var errClosed = errors.New("comm: the world was closed")

// Fabric is a world of communicators that can be split into groups: what a parallel plan
// needs to build its tensor, context, data and expert groups. The in-process World
// (World.Fabric) and engine/comm/nccl's World implement it, so the same plan code runs over
// simulated devices and over GPUs.
//
// Ranks are the ranks this process drives, 0 <= i < Size(); for a world spread over
// several processes they are the process's local ranks, and Split still takes global ranks.
type Fabric interface {
	// Size is the number of ranks this process drives.
	Size() int
	// Comm returns local rank i's communicator over the whole world.
	Comm(i int) Communicator
	// Split partitions the world's ranks into groups named name+index (every rank in exactly
	// one group, in the order of its list) and returns each local rank's communicator of its
	// group, indexed by local rank.
	Split(name string, groups [][]int) ([]Communicator, error)
	// Abort makes every pending and later collective of every group fail with err, so that
	// no rank waits forever for one that failed.
	Abort(err error)
	// Close releases the communicators of every group. It does not close the devices.
	Close() error
}

// Fabric returns w as a Fabric.
func (w *World) Fabric() Fabric { return inprocFabric{w} }

type inprocFabric struct{ w *World }

func (f inprocFabric) Size() int               { return f.w.Size() }
func (f inprocFabric) Comm(i int) Communicator { return f.w.Comm(i) }
func (f inprocFabric) Abort(err error)         { f.w.Abort(err) }

// Close aborts the world: in-process groups hold only host buffers, and aborting releases any
// rank still waiting in a collective.
func (f inprocFabric) Close() error {
	f.w.Abort(errClosed)
	return nil
}

func (f inprocFabric) Split(name string, groups [][]int) ([]Communicator, error) {
	cs, err := f.w.Split(name, groups)
	if err != nil {
		return nil, err
	}
	out := make([]Communicator, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out, nil
}
