package nccl

import "github.com/halo-shell/halo-shell/engine/comm"

// Fabric returns w as a comm.Fabric (the world a parallel plan builds its groups from). Its
// ranks are this process's local ranks; Split takes global ranks.
func (w *World) Fabric() comm.Fabric { return fabric{w} }

type fabric struct{ w *World }

func (f fabric) Size() int                    { return f.w.Local() }
func (f fabric) Comm(i int) comm.Communicator { return f.w.Comm(i) }
func (f fabric) Close() error                 { return f.w.Close() }

// Abort aborts every communicator; err is what the failed rank reported and is already
// returned to the caller by the rank itself, so only the abort's own failure is dropped here.
func (f fabric) Abort(error) { _ = f.w.Abort() }

func (f fabric) Split(name string, groups [][]int) ([]comm.Communicator, error) {
	cs, err := f.w.Split(name, groups)
	if err != nil {
		return nil, err
	}
	out := make([]comm.Communicator, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out, nil
}
