package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/backend/cuda" // registers the cuda device
)

func init() {
	var asJSON, compile bool
	cmd := &cobra.Command{
		Use:   "cuda-info",
		Short: "Show which CUDA libraries were found where, the GPUs, their architecture and memory",
		Long: `Loads the CUDA driver, NVRTC and cuBLASLt the way the cuda backend does (HALO_LIBCUDA,
HALO_LIBNVRTC and HALO_LIBCUBLASLT override the search; then LD_LIBRARY_PATH, then the standard
places) and prints what it found: each library's path or why it is missing, the versions, and
every device with its architecture, multiprocessors and memory. These are the diagnostics that
device: auto logs when it falls back to the CPU. With --compile it also opens device 0 and
compiles (or loads from the kernel cache) every kernel.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dg := cuda.Diagnose()
			var prep *kernelPrep
			if compile && dg.Usable {
				prep = prepareKernels()
			}
			w := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					cuda.Diagnostics
					Kernels *kernelPrep `json:"kernels,omitempty"`
				}{dg, prep})
			}
			printDiagnostics(w, dg, prep)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&compile, "compile", false, "open device 0 and compile (or load from cache) every kernel")
	runCmd.AddCommand(cmd)
}

type kernelPrep struct {
	CacheDir  string  `json:"cache_dir"`
	Files     int     `json:"files"`
	FromCache int     `json:"from_cache"`
	Seconds   float64 `json:"seconds"`
	Error     string  `json:"error,omitempty"`
}

func prepareKernels() *kernelPrep {
	p := &kernelPrep{Files: len(cuda.KernelFiles())}
	p.CacheDir, _ = cuda.KernelCacheDir()
	start := time.Now()
	d, err := cuda.Open(0)
	if err == nil {
		p.FromCache, err = d.PrepareKernels()
		if cerr := d.Close(); err == nil {
			err = cerr
		}
	}
	p.Seconds = time.Since(start).Seconds()
	if err != nil {
		p.Error = err.Error()
	}
	return p
}

func printDiagnostics(w io.Writer, dg cuda.Diagnostics, prep *kernelPrep) {
	for _, l := range dg.Libraries {
		if l.Path != "" {
			fmt.Fprintf(w, "%-12s %s\n", l.What+":", l.Path)
		} else {
			fmt.Fprintf(w, "%-12s missing: %s\n", l.What+":", l.Err)
		}
	}
	if dg.DriverVersion != "" {
		fmt.Fprintf(w, "driver API:  %s\n", dg.DriverVersion)
	}
	if dg.NVRTCVersion != "" {
		fmt.Fprintf(w, "NVRTC:       %s\n", dg.NVRTCVersion)
	}
	if dg.CublasLtVersion != 0 {
		fmt.Fprintf(w, "cuBLASLt:    %d\n", dg.CublasLtVersion)
	}
	for _, d := range dg.Devices {
		fmt.Fprintf(w, "cuda:%d       %s, %s (compute %d.%d), %d SMs, %.1f GiB, L2 %d MiB, shared/block %d KiB\n",
			d.Ordinal, d.Name, d.Arch, d.Major, d.Minor, d.SMs, float64(d.TotalMem)/(1<<30), d.L2Bytes>>20, d.MaxSharedPerBlock>>10)
	}
	if dg.Usable {
		fmt.Fprintln(w, "usable:      yes")
	} else {
		fmt.Fprintf(w, "usable:      no: %s\n", dg.Reason)
	}
	if prep != nil {
		if prep.Error != "" {
			fmt.Fprintf(w, "kernels:     failed: %s\n", prep.Error)
		} else {
			fmt.Fprintf(w, "kernels:     %d files ready in %.2fs (%d from the cache in %s)\n", prep.Files, prep.Seconds, prep.FromCache, prep.CacheDir)
		}
	}
}
