// Command demo runs restow's demo on a throw-away control plane: `make demo`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/restow/restow/internal/demo"
)

func main() {
	opts := demo.Options{Out: os.Stdout}
	flag.IntVar(&opts.Objects, "objects", 3000, "How many CronTabs to create.")
	flag.StringVar(&opts.CRDDirectory, "crd-dir", "config/crd/bases", "Directory of restow's CRD.")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := demo.Run(ctx, opts)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case interrupted:
		fmt.Fprintln(os.Stderr, "Interrupted; the control plane is stopped and its files removed.")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
