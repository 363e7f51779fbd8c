package halo

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Plot sizes.
const (
	plotWidth  = 16 * vg.Centimeter
	plotHeight = 9 * vg.Centimeter
)

// Series is one line of a plot.
type Series struct {
	Name string
	X, Y []float64
}

// PlotLoss plots the training loss (and the eval loss, where measured) of Metrics against
// the step.
func PlotLoss() Image {
	ms := Metrics()
	train := Series{Name: "train loss"}
	eval := Series{Name: "eval loss"}
	for _, m := range ms {
		train.X = append(train.X, float64(m.Step))
		train.Y = append(train.Y, m.Loss)
		if !math.IsNaN(m.EvalLoss) {
			eval.X = append(eval.X, float64(m.Step))
			eval.Y = append(eval.Y, m.EvalLoss)
		}
	}
	s := []Series{train}
	if len(eval.X) > 0 {
		s = append(s, eval)
	}
	return mustPlot("halo.PlotLoss", "loss", "step", "loss", s...)
}

// PlotLR plots the learning rate of Metrics against the step.
func PlotLR() Image {
	lr := Series{Name: "learning rate"}
	for _, m := range Metrics() {
		lr.X = append(lr.X, float64(m.Step))
		lr.Y = append(lr.Y, m.LR)
	}
	return mustPlot("halo.PlotLR", "learning rate", "step", "lr", lr)
}

// PlotLines plots y against x (one line; x nil means 0, 1, 2, ...).
func PlotLines(title string, x, y []float64) Image {
	if x == nil {
		x = make([]float64, len(y))
		for i := range x {
			x[i] = float64(i)
		}
	}
	return mustPlot("halo.PlotLines", title, "x", "y", Series{Name: title, X: x, Y: y})
}

func mustPlot(op, title, xl, yl string, series ...Series) Image {
	im, err := Plot(title, xl, yl, series...)
	if err != nil {
		fail(op, err)
	}
	return im
}

// Plot draws line series and renders them as PNG and SVG.
func Plot(title, xLabel, yLabel string, series ...Series) (Image, error) {
	return PlotScaled(title, xLabel, yLabel, false, false, series...)
}

// PlotScaled is Plot with a logarithmic x axis when logX is set and a logarithmic y axis when
// logY is set (a roofline is drawn log-log). Points that a log axis cannot show (zero or
// negative) are left out.
func PlotScaled(title, xLabel, yLabel string, logX, logY bool, series ...Series) (Image, error) {
	p := plot.New()
	if logX {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if logY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Add(plotter.NewGrid())
	points := 0
	for i, s := range series {
		if len(s.X) != len(s.Y) {
			return Image{}, fmt.Errorf("plot %q: series %q has %d x values and %d y values", title, s.Name, len(s.X), len(s.Y))
		}
		xy := make(plotter.XYs, 0, len(s.X))
		for j := range s.X {
			if math.IsNaN(s.Y[j]) || math.IsInf(s.Y[j], 0) || math.IsNaN(s.X[j]) || math.IsInf(s.X[j], 0) ||
				(logX && s.X[j] <= 0) || (logY && s.Y[j] <= 0) {
				continue
			}
			xy = append(xy, plotter.XY{X: s.X[j], Y: s.Y[j]})
		}
		if len(xy) == 0 {
			continue
		}
		points += len(xy)
		l, err := plotter.NewLine(xy)
		if err != nil {
			return Image{}, fmt.Errorf("plot %q: series %q: %w", title, s.Name, err)
		}
		l.Color = plotColors[i%len(plotColors)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		if len(series) > 1 {
			p.Legend.Add(s.Name, l)
		}
		if len(xy) == 1 {
			sc, err := plotter.NewScatter(xy)
			if err == nil {
				sc.Color = l.Color
				p.Add(sc)
			}
		}
	}
	if points == 0 {
		return Image{}, errors.New("nothing to plot yet: run some steps first (:step N)")
	}
	p.Legend.Top = true
	im := Image{Title: title}
	var buf bytes.Buffer
	c := vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(plotWidth, plotHeight), vgimg.UseDPI(96))}
	p.Draw(draw.New(c))
	if _, err := c.WriteTo(&buf); err != nil {
		return Image{}, fmt.Errorf("plot %q: png: %w", title, err)
	}
	im.PNG = append([]byte(nil), buf.Bytes()...)
	buf.Reset()
	sc := vgsvg.New(plotWidth, plotHeight)
	p.Draw(draw.New(sc))
	if _, err := sc.WriteTo(&buf); err != nil {
		return Image{}, fmt.Errorf("plot %q: svg: %w", title, err)
	}
	im.SVG = append([]byte(nil), buf.Bytes()...)
	return im, nil
}
