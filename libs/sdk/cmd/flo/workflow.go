package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

func newWorkflowCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("workflow", "Create and manage workflow definitions, start runs and follow them")
	cmd.AddCommand(newWorkflowCreateCmd(g))
	cmd.AddCommand(newWorkflowValidateCmd(g))
	cmd.AddCommand(newWorkflowGetCmd(g))
	cmd.AddCommand(newWorkflowListCmd(g))
	cmd.AddCommand(workflowByName(g, "disable", "Refuse new runs of every version of a workflow; running runs go on", (*flo.Client).DisableWorkflow))
	cmd.AddCommand(workflowByName(g, "enable", "Let new runs of a workflow start again", (*flo.Client).EnableWorkflow))
	cmd.AddCommand(newWorkflowStartCmd(g))
	cmd.AddCommand(byArg(g, "status RUN_ID", "Show a run: status, current step, terminal, outputs and timestamps", (*flo.Client).GetRun))
	cmd.AddCommand(newWorkflowRunsCmd(g))
	cmd.AddCommand(newWorkflowSignalCmd(g))
	cmd.AddCommand(newWorkflowCancelCmd(g))
	cmd.AddCommand(newWorkflowHistoryCmd(g))
	cmd.AddCommand(newWorkflowPlansCmd(g))
	cmd.AddCommand(newWorkflowCacheCmd(g))
	cmd.AddCommand(newWorkflowSchedulesCmd(g))
	return cmd
}

// summary is a definition without its YAML, for commands whose output is about the
// workflow's state rather than its source.
func summary(w *flo.Workflow) *flo.Workflow {
	s := *w
	s.YAML = ""
	return &s
}

// byArg builds the commands that take one argument, make one call with it and print what the
// call returns.
func byArg[T any](g *globals, use, short string, call func(*flo.Client, context.Context, string) (T, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				v, err := call(c, cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, v)
			})
		},
	}
}

// workflowByName builds the commands that take a workflow name and print the workflow's state.
func workflowByName(g *globals, use, short string, call func(*flo.Client, context.Context, string) (*flo.Workflow, error)) *cobra.Command {
	return byArg(g, use+" NAME", short, func(c *flo.Client, ctx context.Context, name string) (*flo.Workflow, error) {
		w, err := call(c, ctx, name)
		if err != nil {
			return nil, err
		}
		return summary(w), nil
	})
}

// validDefinition is what `workflow create` and `workflow validate` print for a valid definition.
type validDefinition struct {
	*flo.Workflow
	Warnings []flo.Diagnostic `json:"warnings"`
}

func newWorkflowCreateCmd(g *globals) *cobra.Command {
	return definitionCmd(g, "create -f FILE", "Create a workflow version from a YAML definition",
		"Validate a YAML definition (-f - reads standard input) and store it as a new version of\n"+
			"its workflow, then print the workflow with the validator's warnings. A definition with\n"+
			"errors is not stored: each diagnostic is printed on standard error as\n"+
			"LINE:COL CODE PATH: MESSAGE and the command exits with status 1.",
		func(ctx context.Context, c *flo.Client, yaml string) (*flo.Workflow, []flo.Diagnostic, error) {
			w, warnings, err := c.CreateWorkflow(ctx, yaml)
			var invalid *flo.ValidationError
			if errors.As(err, &invalid) {
				return nil, invalid.Diagnostics, nil
			}
			return w, warnings, err
		})
}

func newWorkflowValidateCmd(g *globals) *cobra.Command {
	return definitionCmd(g, "validate -f FILE", "Check a YAML definition without storing it",
		"Check a YAML definition as create would, storing nothing. A valid definition is printed\n"+
			"as create would print it; diagnostics go to standard error as LINE:COL CODE PATH: MESSAGE,\n"+
			"and a definition with errors makes the command exit with status 1.",
		func(ctx context.Context, c *flo.Client, yaml string) (*flo.Workflow, []flo.Diagnostic, error) {
			v, err := c.ValidateWorkflow(ctx, yaml)
			switch {
			case err != nil:
				return nil, nil, err
			case !v.Valid:
				return nil, v.Diagnostics, nil
			}
			return v.Workflow, v.Diagnostics, nil
		})
}

// definitionCmd builds create and validate, which differ only in the call made with the YAML:
// check returns the workflow with its warnings, or no workflow and the diagnostics that make
// the definition invalid.
func definitionCmd(g *globals, use, short, long string, check func(context.Context, *flo.Client, string) (*flo.Workflow, []flo.Diagnostic, error)) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			yaml, err := readFileOrStdin(cmd, file)
			if err != nil {
				return fmt.Errorf("read definition: %w", err)
			}
			return g.withClient(func(c *flo.Client) error {
				w, diagnostics, err := check(cmd.Context(), c, string(yaml))
				if err != nil {
					return err
				}
				printDiagnostics(cmd, diagnostics)
				if w == nil {
					return invalidDefinition(file, diagnostics)
				}
				return printJSON(cmd, validDefinition{summary(w), diagnostics})
			})
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the YAML definition (- for standard input)")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}

// readFileOrStdin reads file, or standard input for "-".
func readFileOrStdin(cmd *cobra.Command, file string) ([]byte, error) {
	if file == "-" {
		return io.ReadAll(cmd.InOrStdin())
	}
	return os.ReadFile(file)
}

// printDiagnostics writes one diagnostic per line on standard error, where people look for
// them, leaving standard output to the JSON scripts read.
func printDiagnostics(cmd *cobra.Command, ds []flo.Diagnostic) {
	for _, d := range ds {
		fmt.Fprintln(cmd.ErrOrStderr(), d.String())
	}
}

// invalidDefinition is the error that ends create or validate of a definition with errors.
func invalidDefinition(file string, ds []flo.Diagnostic) error {
	errs := 0
	for _, d := range ds {
		if d.Severity == flo.SeverityError {
			errs++
		}
	}
	plural := "s"
	if errs == 1 {
		plural = ""
	}
	return fmt.Errorf("%s: invalid workflow definition (%d error%s)", file, errs, plural)
}

func newWorkflowGetCmd(g *globals) *cobra.Command {
	var version string
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a workflow version with its YAML (the latest unless --version)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				w, err := c.GetWorkflow(cmd.Context(), args[0], version)
				if err != nil {
					return err
				}
				return printJSON(cmd, w)
			})
		},
	}
	cmd.Flags().StringVar(&version, "version", "", "the version to show (default: the latest)")
	return cmd
}

func newWorkflowListCmd(g *globals) *cobra.Command {
	var opts flo.ListWorkflowsOptions
	cmd := &cobra.Command{
		Use:   "list [NAME]",
		Short: "List the namespace's workflows, the latest version of each unless --all-versions",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				opts.Name = args[0]
			}
			return g.withClient(func(c *flo.Client) error {
				list, err := c.ListWorkflows(cmd.Context(), opts)
				if err != nil {
					return err
				}
				out := make([]*flo.Workflow, len(list))
				for i, w := range list {
					out[i] = summary(w)
				}
				return printJSON(cmd, out)
			})
		},
	}
	cmd.Flags().BoolVar(&opts.AllVersions, "all-versions", false, "list every version, not only the latest")
	return cmd
}

func newWorkflowStartCmd(g *globals) *cobra.Command {
	var (
		opts    flo.StartWorkflowOptions
		input   string
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "start NAME ['JSON']",
		Short: "Start a run and print its id, or with --wait the finished run",
		Long: "Start a run of the latest version of a workflow (or --version) with the JSON argument,\n" +
			"or --input, as its input; --input @FILE reads the input from FILE (@- from standard\n" +
			"input). Starting again with the same --idempotency-key returns the first run\n" +
			"(\"created\": false). A disabled workflow refuses the start.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, err := jsonInput(cmd, args, "input", input)
			if err != nil {
				return err
			}
			if wait && timeout <= 0 {
				return fmt.Errorf("--timeout must be positive, got %s", timeout)
			}
			return g.withClient(func(c *flo.Client) error {
				started, err := c.StartWorkflow(cmd.Context(), args[0], body, opts)
				if err != nil {
					return err
				}
				if !wait {
					return printJSON(cmd, started)
				}
				return awaitRun(cmd, c, started.RunID, timeout)
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&input, "input", "i", "", "the run's input: JSON, or @FILE to read it from FILE (@- for standard input)")
	f.StringVar(&opts.Version, "version", "", "the version to run (default: the latest)")
	f.StringVar(&opts.IdempotencyKey, "idempotency-key", "", "starting again with the same key returns the same run")
	f.BoolVar(&wait, "wait", false, "wait for the run to end and print it")
	f.DurationVar(&timeout, "timeout", time.Minute, "with --wait, how long to wait")
	return cmd
}

// awaitRun waits up to timeout for run id to end and prints it as it then is; a run still
// going when the time is up is printed too, and the command fails.
func awaitRun(cmd *cobra.Command, c *flo.Client, id string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	run, err := c.AwaitRun(ctx, id)
	if err != nil && (run == nil || cmd.Context().Err() != nil || !errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	if err := printJSON(cmd, run); err != nil {
		return err
	}
	if !run.Status.Final() {
		return fmt.Errorf("run %s is still %s after %s", id, run.Status, timeout)
	}
	return nil
}

// jsonInput returns the JSON a command got as its second argument or in its flag: the value
// itself, or the contents of the file an @FILE value names (@- for standard input), checked
// here so a typo costs no round trip. No value is no JSON at all.
func jsonInput(cmd *cobra.Command, args []string, flag, value string) (json.RawMessage, error) {
	if len(args) == 2 {
		if cmd.Flags().Changed(flag) {
			return nil, fmt.Errorf("give the JSON as an argument or --%s, not both", flag)
		}
		value = args[1]
	}
	if value == "" {
		return nil, nil
	}
	if file, ok := strings.CutPrefix(value, "@"); ok {
		b, err := readFileOrStdin(cmd, file)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", flag, err)
		}
		value = string(b)
	}
	payload, err := parsePayload(value)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	return payload, nil
}

func newWorkflowRunsCmd(g *globals) *cobra.Command {
	var (
		filter        flo.RunFilter
		status        string
		since, before string
	)
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List runs, newest first, with filters",
		Long: "List the namespace's runs, newest first, a page at a time: pass the printed\n" +
			"next_page_token to --page-token for the next page. --since and --before take an\n" +
			"RFC 3339 time or a duration meaning that long ago (1h).\n\n" +
			"--where filters by search attributes (the workflow's searchAttributes) and the\n" +
			"built-in fields workflow, status, started_at and finished_at:\n\n" +
			"  flo workflow runs --where 'customer_id = \"c-42\" AND order_amount > 100'\n\n" +
			"Operators: =, !=, <, <=, >, >=, IN (\"a\", \"b\"), AND (binding tighter than OR), OR,\n" +
			"parentheses. Strings in double quotes; timestamps as RFC 3339 strings or epoch\n" +
			"milliseconds. A run without the attribute matches no comparison of it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if filter.Limit < 0 {
				return errors.New("--limit must not be negative")
			}
			if status != "" {
				st, err := flo.ParseRunStatus(status)
				if err != nil {
					return err
				}
				filter.Status = st
			}
			var err error
			if filter.CreatedAfter, err = parseTimeFlag("--since", since); err != nil {
				return err
			}
			if filter.CreatedBefore, err = parseTimeFlag("--before", before); err != nil {
				return err
			}
			return g.withClient(func(c *flo.Client) error {
				runs, next, err := c.ListRuns(cmd.Context(), filter)
				if err != nil {
					return err
				}
				return printJSON(cmd, struct {
					Runs []*flo.Run `json:"runs"`
					Next string     `json:"next_page_token,omitempty"`
				}{runs, next})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&filter.Workflow, "workflow", "", "only runs of this workflow")
	f.StringVar(&status, "status", "", "only runs in this state: pending, running, waiting, completed, failed, cancelled or timed_out")
	f.StringVar(&since, "since", "", "only runs created at or after this time (RFC 3339, or a duration ago such as 1h)")
	f.StringVar(&before, "before", "", "only runs created before this time (RFC 3339, or a duration ago such as 10m)")
	f.IntVar(&filter.Limit, "limit", 0, "most runs to list, at most 1000 (default 100)")
	f.StringVar(&filter.PageToken, "page-token", "", "continue a list where the previous page ended")
	f.StringVar(&filter.Where, "where", "", `only runs matching this query, e.g. 'customer_id = "c-42" AND order_amount > 100'`)
	return cmd
}

// parseTimeFlag reads an RFC 3339 time, or a duration meaning that long before now.
func parseTimeFlag(name, value string) (time.Time, error) {
	if value == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, value); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(value)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time or a positive duration such as 1h", name, value)
	}
	return time.Now().Add(-d), nil
}

func newWorkflowSignalCmd(g *globals) *cobra.Command {
	var signalType, data string
	cmd := &cobra.Command{
		Use:   "signal RUN_ID --type TYPE ['JSON']",
		Short: "Send a signal to a run and print the signal's id",
		Long: "Send a run a signal of --type with the JSON argument, or --data, as its payload\n" +
			"(--data @FILE reads it from FILE). A step waiting for that type resumes; otherwise the\n" +
			"signal is kept until a step waits for it.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			payload, err := jsonInput(cmd, args, "data", data)
			if err != nil {
				return err
			}
			return g.withClient(func(c *flo.Client) error {
				id, err := c.SignalRun(cmd.Context(), args[0], signalType, payload)
				if err != nil {
					return err
				}
				return printJSON(cmd, map[string]string{"signal_id": id})
			})
		},
	}
	cmd.Flags().StringVar(&signalType, "type", "", "the signal's type, as the waitForSignal step names it")
	cmd.Flags().StringVar(&data, "data", "", "the signal's payload: JSON, or @FILE to read it from FILE (@- for standard input)")
	_ = cmd.MarkFlagRequired("type")
	return cmd
}

func newWorkflowCancelCmd(g *globals) *cobra.Command {
	var reason string
	cmd := byArg(g, "cancel RUN_ID", "Cancel a run, with the child runs it waits for, and print it",
		func(c *flo.Client, ctx context.Context, id string) (*flo.Run, error) {
			return c.CancelRun(ctx, id, reason)
		})
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded in the run's history")
	return cmd
}

func newWorkflowHistoryCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "history RUN_ID",
		Short: "Show a run's history, one event per line (--json for the raw events)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				events, err := c.GetRunHistory(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd, events)
				}
				for _, e := range events {
					if _, err := fmt.Fprintln(cmd.OutOrStdout(), historyLine(e)); err != nil {
						return fmt.Errorf("write output: %w", err)
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the events as JSON")
	return cmd
}

// historyTypeWidth fits the longest event type, plan_executor_exhausted, so the columns after
// it line up.
const historyTypeWidth = len("plan_executor_exhausted")

// historyLine renders an event as "SEQ TIME TYPE [step=STEP] [attempt=N] [DETAIL]", the
// columns people scan first at the front.
func historyLine(e *flo.HistoryEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%3d  %s  %-*s", e.Seq, e.At.UTC().Format("2006-01-02T15:04:05.000Z"), historyTypeWidth, e.Type)
	if e.Step != "" {
		fmt.Fprintf(&b, "  step=%s", e.Step)
	}
	if e.Attempt > 0 {
		fmt.Fprintf(&b, "  attempt=%d", e.Attempt)
	}
	if e.Detail != "" {
		b.WriteString("  ")
		b.WriteString(e.Detail)
	}
	return strings.TrimRight(b.String(), " ")
}
