package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

func newWorkflowSchedulesCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "List the namespace's workflow schedules: next fire time, last run and state",
		Long: "List every workflow schedule of the namespace: its cron expression (with its time zone)\n" +
			"or interval, the next fire time, the tick and run id of the last run it started, its state\n" +
			"(active; paused by its definition; disabled with its workflow) and how many ticks started a\n" +
			"run or were skipped because max_concurrent runs were still going.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(func(c *flo.Client) error {
				list, err := c.ListSchedules(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd, list)
				}
				if err := printSchedules(cmd.OutOrStdout(), list); err != nil {
					return fmt.Errorf("write output: %w", err)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the schedules as JSON")
	return cmd
}

// printSchedules writes schedules as a table, times in UTC.
func printSchedules(out io.Writer, list []*flo.Schedule) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if len(list) == 0 {
		fmt.Fprintln(w, "no schedules")
		return w.Flush()
	}
	fmt.Fprintln(w, "WORKFLOW\tVERSION\tSCHEDULE\tNEXT FIRE\tLAST FIRE\tLAST RUN\tSTATE\tFIRED\tSKIPPED")
	for _, s := range list {
		spec := fmt.Sprintf("every %d ms", s.Interval.Milliseconds())
		if s.Cron != "" {
			spec = s.Cron + " " + s.Timezone
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", s.Workflow, s.Version, spec, clock(s.NextFireAt),
			clock(s.LastFireAt), orDash(s.LastRunID), s.State, s.Fired, s.Skipped)
	}
	return w.Flush()
}

// clock prints a time in UTC to the millisecond, or - for none.
func clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
