package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

// replicaNote is said with every answer of `workflow plans`, since the numbers are easy to
// mistake for the cluster's.
const replicaNote = "health scores, samples and breakers are kept in memory by each workflow replica " +
	"and reset when it restarts; other replicas may show different values"

func newWorkflowPlansCmd(g *globals) *cobra.Command {
	var (
		version string
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "plans NAME",
		Short: "Show a workflow's plans: each executor's health, breaker and recent attempts on one replica",
		Long: "Show each plan of a workflow version (the latest unless --version) with each executor's\n" +
			"health score, samples, API and business success rates, breaker state and attempts in the\n" +
			"last minute, as the workflow service replica that answers sees them. Health and breakers\n" +
			"are in memory on each replica and reset when it restarts, so another replica may answer\n" +
			"differently; the output names the replica.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				plans, err := c.GetWorkflowPlans(cmd.Context(), args[0], version)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd, struct {
						*flo.WorkflowPlans
						Note string `json:"note"`
					}{plans, replicaNote})
				}
				if err := printPlans(cmd.OutOrStdout(), plans); err != nil {
					return fmt.Errorf("write output: %w", err)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&version, "version", "", "the version to show (default: the latest)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the plans as JSON")
	return cmd
}

// printPlans writes plans as a table per plan under a header naming the replica and saying
// what its numbers are.
func printPlans(out io.Writer, plans *flo.WorkflowPlans) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "workflow %s version %s, as replica %s sees it\n", plans.Workflow, plans.Version, plans.Replica)
	fmt.Fprintf(w, "note: %s\n", replicaNote)
	if len(plans.Plans) == 0 {
		fmt.Fprintln(w, "\nno plans")
	}
	for _, p := range plans.Plans {
		fmt.Fprintf(w, "\nplan %s (%s)\n", p.Name, p.Selection)
		fmt.Fprintln(w, "  EXECUTOR\tACTION\tPRIORITY\tSCORE\tSAMPLES\tAPI OK\tBUSINESS OK\tBREAKER\tATTEMPTS/MIN")
		for _, e := range p.Executors {
			fmt.Fprintf(w, "  %s\t%s\t%d\t%.3f\t%d\t%.3f\t%.3f\t%s\t%d\n", e.Name, e.Action, e.Priority, e.Score,
				e.Samples, e.APISuccessRate, e.BusinessSuccessRate, e.Breaker, e.AttemptsLastMinute)
		}
	}
	return w.Flush()
}

func newWorkflowCacheCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("cache", "Manage the cache of plan outcomes")
	cmd.AddCommand(newWorkflowCacheInvalidateCmd(g))
	return cmd
}

func newWorkflowCacheInvalidateCmd(g *globals) *cobra.Command {
	var event, key string
	cmd := &cobra.Command{
		Use:   "invalidate --event EVENT [--key KEY]",
		Short: "Remove the cached plan outcomes an event invalidates and print how many",
		Long: "Remove, in the namespace, the cached plan outcomes whose plan lists --event in its\n" +
			"cache's invalidate_on; with --key, only the entry stored under that rendered cache key\n" +
			"(\"charge:c-1:k-9\"). The cache is shared by every workflow replica: the next run of such a\n" +
			"plan calls an executor again. Events follow the rule of signal types, as invalidate_on does.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(func(c *flo.Client) error {
				removed, err := c.InvalidatePlanCache(cmd.Context(), event, key)
				if err != nil {
					return err
				}
				return printJSON(cmd, struct {
					Event   string `json:"event"`
					Key     string `json:"key,omitempty"`
					Removed int64  `json:"removed"`
				}{event, key, removed})
			})
		},
	}
	cmd.Flags().StringVar(&event, "event", "", "the event, as invalidate_on names it (payment.refunded)")
	cmd.Flags().StringVar(&key, "key", "", "only the entry with this rendered cache key")
	_ = cmd.MarkFlagRequired("event")
	return cmd
}
