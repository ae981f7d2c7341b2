package main

import (
	"encoding/json"
	"errors"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

func newTaskCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("task", "Inspect tasks and dead letters")
	cmd.AddCommand(&cobra.Command{
		Use:   "get ID",
		Short: "Show a task",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				task, err := c.GetTask(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, task)
			})
		},
	})

	var timeout time.Duration
	await := &cobra.Command{
		Use:   "await ID",
		Short: "Wait for a task to finish and show it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return errors.New("--timeout must be positive")
			}
			return g.withClient(func(c *flo.Client) error {
				return awaitTask(cmd, c, args[0], timeout)
			})
		},
	}
	await.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait")
	cmd.AddCommand(await)
	cmd.AddCommand(newCompleteCmd(g), newFailCmd(g))
	cmd.AddCommand(newDLQCmd(g))
	return cmd
}

// newCompleteCmd finishes, by completion token, a task whose handler said its result comes later.
func newCompleteCmd(g *globals) *cobra.Command {
	var outcome string
	cmd := &cobra.Command{
		Use:   "complete TOKEN ['JSON']",
		Short: "Complete a task waiting for its result, by its completion token, and show it",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var result json.RawMessage
			if len(args) == 2 {
				var err error
				if result, err = parsePayload(args[1]); err != nil {
					return err
				}
			}
			return g.withClient(func(c *flo.Client) error {
				task, err := c.CompleteTask(cmd.Context(), args[0], result, outcome)
				if err != nil {
					return err
				}
				return printJSON(cmd, task)
			})
		},
	}
	cmd.Flags().StringVar(&outcome, "outcome", "", "a named outcome for workflow routing (default: success)")
	return cmd
}

// newFailCmd fails, by completion token, a task whose handler said its result comes later.
func newFailCmd(g *globals) *cobra.Command {
	var msg, code string
	cmd := &cobra.Command{
		Use:   "fail TOKEN --error MESSAGE",
		Short: "Fail a task waiting for its result, by its completion token, and show it; no further attempt runs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if msg == "" {
				return errors.New("--error is required")
			}
			cause := errors.New(msg)
			if code != "" {
				cause = flo.NewErrorWithCode(code, "%s", msg)
			}
			return g.withClient(func(c *flo.Client) error {
				task, err := c.FailTask(cmd.Context(), args[0], cause)
				if err != nil {
					return err
				}
				return printJSON(cmd, task)
			})
		},
	}
	cmd.Flags().StringVar(&msg, "error", "", "the failure's message")
	cmd.Flags().StringVar(&code, "code", "", "the failure's error code (letters, digits, '_', '.', ':', '-')")
	return cmd
}

func newDLQCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("dlq", "List and requeue dead-lettered tasks")
	var (
		action string
		limit  int
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List dead-lettered tasks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return errors.New("--limit must not be negative")
			}
			return g.withClient(func(c *flo.Client) error {
				tasks, err := c.ListDeadLetters(cmd.Context(), action, limit)
				if err != nil {
					return err
				}
				return printJSON(cmd, tasks)
			})
		},
	}
	list.Flags().StringVar(&action, "action", "", "only this action's dead letters")
	list.Flags().IntVar(&limit, "limit", 0, "at most this many, newest first (default: every one, fetched a page at a time)")
	cmd.AddCommand(list)
	cmd.AddCommand(&cobra.Command{
		Use:   "requeue ID",
		Short: "Put a dead-lettered task back in its queue",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				task, err := c.RequeueDeadLetter(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, task)
			})
		},
	})
	return cmd
}
