package main

import (
	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

func newWorkerCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("worker", "List, inspect, drain and deregister workers")
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the namespace's workers with their status, load and counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(func(c *flo.Client) error {
				list, err := c.ListWorkers(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(cmd, list)
			})
		},
	})
	cmd.AddCommand(byArg(g, "get ID", "Show a worker", (*flo.Client).GetWorker))
	cmd.AddCommand(byArg(g, "drain ID", "Drain a worker: it finishes what it holds, takes nothing new, then deregisters",
		(*flo.Client).DrainWorker))
	cmd.AddCommand(&cobra.Command{
		Use:   "deregister ID",
		Short: "Remove a worker's record, for example of a worker that died",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				if err := c.DeregisterWorker(cmd.Context(), args[0]); err != nil {
					return err
				}
				return printJSON(cmd, map[string]string{"worker_id": args[0], "status": "deregistered"})
			})
		},
	})
	return cmd
}
