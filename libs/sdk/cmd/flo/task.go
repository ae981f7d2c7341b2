package main

import (
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
	cmd.AddCommand(newDLQCmd(g))
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
