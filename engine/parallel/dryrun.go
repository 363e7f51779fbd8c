package parallel

import (
	"fmt"
	"io"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
)

// ShapeFromConfig returns the structure of the model config.json describes (its family's
// config.Shape), without building the model or reading any weight. Configurations the model
// code refuses are refused here too.
func ShapeFromConfig(cfg *config.Config) (mesh.ModelShape, error) {
	if _, err := models.Lookup(cfg.ModelType); err != nil {
		return mesh.ModelShape{}, err
	}
	a, err := models.ArchFromConfig(cfg.Clone())
	if err != nil {
		return mesh.ModelShape{}, err
	}
	return a.Shape, nil
}

// DryRun checks layout l on devices d for the model of cfg and workload w, and writes the mesh
// (degrees and groups) and the per-device memory estimate to out. A refused layout is returned
// as the *mesh.LayoutError (with its suggestion) and nothing is written.
func DryRun(out io.Writer, cfg *config.Config, d mesh.Devices, l mesh.Layout, w mesh.Workload) error {
	shape, err := ShapeFromConfig(cfg)
	if err != nil {
		return err
	}
	m, err := mesh.New(d, l, shape, w.SeqLen)
	if err != nil {
		return err
	}
	l = m.Layout
	fmt.Fprintf(out, "model:   %s, %d parameters, %d layers, %d heads / %d kv heads", cfg.ModelType, shape.NumParameters(), shape.Layers, shape.Heads, shape.KVHeads)
	if shape.MoE() {
		fmt.Fprintf(out, ", %d experts (top %d) in %d layers", shape.Experts, shape.TopK, shape.MoELayers)
	}
	fmt.Fprintf(out, "\ndevices: %s\nlayout:  %s\n", d, l)
	dims := []mesh.Dim{mesh.DimTP, mesh.DimCP, mesh.DimData}
	if l.EP > 1 {
		dims = append(dims, mesh.DimEP, mesh.DimEData)
	}
	for _, dim := range dims {
		g, err := m.Groups(dim)
		if err != nil {
			return err
		}
		if len(g[0]) > 1 {
			fmt.Fprintf(out, "groups %-5s %v\n", dim+":", g)
		}
	}
	e := mesh.Estimate(l, shape, w)
	pb := w.ParamBytes
	if pb <= 0 {
		pb = 4
	}
	fmt.Fprintf(out, "per device (%d tokens x %d rows per data rank, %d-byte elements):\n", w.SeqLen, max(w.Rows, 1), pb)
	for _, row := range []struct {
		name string
		v    int64
	}{{"parameters", e.Params}, {"gradients", e.Grads}, {"optimizer", e.Optimizer}, {"activations", e.Activations}, {"comm buffers", e.Comm}, {"total", e.Total()}} {
		fmt.Fprintf(out, "  %-13s %s\n", row.name, mesh.HumanBytes(row.v))
	}
	return nil
}
