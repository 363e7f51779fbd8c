package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/kernel"
	"github.com/halo-shell/halo-shell/session"
)

func init() {
	var (
		connFile, sessionName string
		verbose               bool
	)
	kernelCmd := &cobra.Command{
		Use:   "kernel",
		Short: "Run the Jupyter kernel (Jupyter starts this), or install its kernelspec",
		Long: `Runs halo-shell's Jupyter kernel on the sockets named by a Jupyter connection file. Cells are Go,
evaluated with state kept between cells against the halo API, plus % magics (%step N, %run,
%pause, %profile N, %set k=v, %save DIR, %status, %attach NAME, %help). The kernel attaches to
the default session (starting it when none runs) or to --session; restarting the kernel leaves
the session, its model and its step count as they were.

Install the kernelspec with: halo-shell kernel install [--user | --prefix DIR | --sys-prefix]`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if connFile == "" {
				return fmt.Errorf("kernel: --connection-file is required (Jupyter passes it; see `halo-shell kernel install`)")
			}
			ci, err := kernel.ReadConnectionFile(connFile)
			if err != nil {
				return err
			}
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			interp, err := kernel.NewHalo(kernel.HaloOptions{Session: sessionName, ClientID: kernel.StableClientID(ci.Key)})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
			defer stop()
			k, err := kernel.New(ctx, kernel.Config{Conn: ci, Interp: interp, Logger: logger})
			if err != nil {
				interp.Close()
				return err
			}
			// SIGINT interrupts the running cell, as interrupt_request does.
			sigint := make(chan os.Signal, 1)
			signal.Notify(sigint, os.Interrupt)
			defer signal.Stop(sigint)
			go func() {
				for range sigint {
					k.Interrupt()
				}
			}()
			logger.Info("kernel: serving", "shell", ci.Endpoint(ci.ShellPort), "session", sessionOrDefault(sessionName))
			if err := k.Run(ctx); err != nil && ctx.Err() == nil {
				return err
			}
			return nil
		},
	}
	kernelCmd.Flags().StringVar(&connFile, "connection-file", "", "Jupyter connection file (JSON: ports, key, signature scheme)")
	kernelCmd.Flags().StringVar(&sessionName, "session", "", "session to attach to: a name, a socket path or tcp://HOST:PORT (default: the default session)")
	kernelCmd.Flags().BoolVar(&verbose, "verbose", false, "log every dropped or ignored message")

	var (
		user, sysPrefix bool
		prefix          string
		specSession     string
	)
	install := &cobra.Command{
		Use:   "install",
		Short: "Install the kernelspec \"halo\" so that Jupyter can start this binary as a kernel",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := kernel.Install(kernel.InstallOptions{User: user, Prefix: prefix, SysPrefix: sysPrefix, Session: specSession})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "installed kernelspec %s in %s\n", kernel.SpecName, dir)
			return nil
		},
	}
	install.Flags().BoolVar(&user, "user", false, "install for this user (the default)")
	install.Flags().StringVar(&prefix, "prefix", "", "install into PREFIX/share/jupyter/kernels")
	install.Flags().BoolVar(&sysPrefix, "sys-prefix", false, "install into the active Python environment (VIRTUAL_ENV, CONDA_PREFIX or python3's sys.prefix)")
	install.Flags().StringVar(&specSession, "session", "", "make the kernel attach to this session instead of the default one")
	kernelCmd.AddCommand(install)
	rootCmd.AddCommand(kernelCmd)
}

func sessionOrDefault(s string) string {
	if s == "" {
		return session.DefaultName
	}
	return s
}
