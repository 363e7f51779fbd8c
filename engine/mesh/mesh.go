package mesh

import "fmt"

// Coord is a rank's position in the mesh.
type Coord struct{ DP, CP, TP int }

// Mesh maps world ranks to coordinates and groups for a checked layout.
type Mesh struct {
	Layout  Layout
	Devices Devices
}

// New checks l on devices d for model m (sequence length seqLen, 0 when unknown) and returns
// the mesh.
func New(d Devices, l Layout, m ModelShape, seqLen int) (*Mesh, error) {
	l = l.Norm(d.Len())
	if err := Check(l, d.Len(), m, seqLen); err != nil {
		return nil, err
	}
	return &Mesh{Layout: l, Devices: d}, nil
}

// Size is the number of ranks.
func (m *Mesh) Size() int { return m.Layout.Size() }

// Coord returns the coordinates of world rank r.
func (m *Mesh) Coord(r int) Coord {
	l := m.Layout
	return Coord{DP: r / (l.CP * l.TP), CP: (r / l.TP) % l.CP, TP: r % l.TP}
}

// Rank returns the world rank at c.
func (m *Mesh) Rank(c Coord) int {
	l := m.Layout
	return (c.DP*l.CP+c.CP)*l.TP + c.TP
}

// Dim names a mesh dimension (or a product of two) for Groups.
type Dim string

const (
	DimDP   Dim = "dp"   // ranks differing only in dp
	DimCP   Dim = "cp"   // ranks differing only in cp
	DimTP   Dim = "tp"   // ranks differing only in tp
	DimData Dim = "data" // ranks with the same tp coordinate (dp × cp): gradient reduction, FSDP shards
	// DimEP is an expert-parallel group: EP consecutive ranks of one data group (data index
	// d = dp·CP + cp; the group of d is d / EP and d's rank in it d mod EP). Expert e lives on
	// the rank e / (E/EP) of each expert group.
	DimEP Dim = "ep"
	// DimEData is the expert-data group: the ranks of one data group with the same rank in their
	// expert groups (d mod EP), which hold replicas of the same experts and sum their
	// gradients.
	DimEData Dim = "edata"
)

// Groups partitions the world ranks along dim; within each group ranks are ordered by the
// coordinates that vary (dp major, then cp, then tp).
func (m *Mesh) Groups(dim Dim) ([][]int, error) {
	key := func(c Coord) (int, error) {
		switch dim {
		case DimDP:
			return c.CP*m.Layout.TP + c.TP, nil
		case DimCP:
			return c.DP*m.Layout.TP + c.TP, nil
		case DimTP:
			return c.DP*m.Layout.CP + c.CP, nil
		case DimData:
			return c.TP, nil
		case DimEP:
			return (c.DP*m.Layout.CP+c.CP)/one(m.Layout.EP)*m.Layout.TP + c.TP, nil
		case DimEData:
			return (c.DP*m.Layout.CP+c.CP)%one(m.Layout.EP)*m.Layout.TP + c.TP, nil
		}
		return 0, fmt.Errorf("mesh: unknown dimension %q (dp, cp, tp, data, ep, edata)", dim)
	}
	idx := map[int]int{}
	var groups [][]int
	for r := 0; r < m.Size(); r++ {
		k, err := key(m.Coord(r))
		if err != nil {
			return nil, err
		}
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], r)
	}
	return groups, nil
}
