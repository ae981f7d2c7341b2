package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

func newActionCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("action", "Register, inspect and invoke actions")
	cmd.AddCommand(newActionRegisterCmd(g))
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the namespace's actions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(func(c *flo.Client) error {
				list, err := c.ListActions(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(cmd, list)
			})
		},
	})
	cmd.AddCommand(byArg(g, "get NAME", "Show an action", (*flo.Client).GetAction))
	cmd.AddCommand(byArg(g, "enable NAME", "Enable an action", (*flo.Client).EnableAction))
	cmd.AddCommand(byArg(g, "disable NAME", "Disable an action", (*flo.Client).DisableAction))
	cmd.AddCommand(newActionInvokeCmd(g))
	return cmd
}

func newActionRegisterCmd(g *globals) *cobra.Command {
	var (
		timeout     time.Duration
		maxAttempts int
		backoff     string
		initial     time.Duration
		maxDelay    time.Duration
		multiplier  float64
	)
	cmd := &cobra.Command{
		Use:   "register NAME",
		Short: "Create an action or change its settings",
		Long: "Create an action or change its settings. Unset flags take the server's defaults:\n" +
			"a 5m timeout, 3 attempts, exponential backoff from 1s up to 5m.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout < 0 || maxAttempts < 0 || initial < 0 || maxDelay < 0 || multiplier < 0 {
				return errors.New("--timeout, --max-attempts, --initial-delay, --max-delay and --multiplier must not be negative")
			}
			opts := flo.ActionOptions{Timeout: timeout, MaxAttempts: maxAttempts}
			flags := cmd.Flags()
			if flags.Changed("backoff") || flags.Changed("initial-delay") || flags.Changed("max-delay") || flags.Changed("multiplier") {
				opts.Backoff = &flo.Backoff{Initial: initial, Max: maxDelay, Multiplier: multiplier}
				if flags.Changed("backoff") {
					kind, err := flo.ParseBackoffKind(backoff)
					if err != nil {
						return err
					}
					opts.Backoff.Kind = kind
				}
			}
			return g.withClient(func(c *flo.Client) error {
				a, err := c.RegisterAction(cmd.Context(), args[0], opts)
				if err != nil {
					return err
				}
				return printJSON(cmd, a)
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&timeout, "timeout", 0, "how long one attempt may run, e.g. 30s (default 5m)")
	f.IntVar(&maxAttempts, "max-attempts", 0, "attempts before the task is dead-lettered (default 3)")
	f.StringVar(&backoff, "backoff", "", "retry delay policy: constant, linear, exponential, exponential_jitter or capped (default exponential)")
	f.DurationVar(&initial, "initial-delay", 0, "delay before the first retry, e.g. 1s")
	f.DurationVar(&maxDelay, "max-delay", 0, "longest delay between attempts, e.g. 1m")
	f.Float64Var(&multiplier, "multiplier", 0, "growth factor of exponential delays, e.g. 2")
	return cmd
}

func newActionInvokeCmd(g *globals) *cobra.Command {
	var (
		idempotencyKey string
		priority       int
		delay          time.Duration
		wait           bool
		timeout        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "invoke NAME ['JSON']",
		Short: "Invoke an action and print the task id, or with --wait the finished task",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var payload json.RawMessage
			if len(args) == 2 {
				var err error
				if payload, err = parsePayload(args[1]); err != nil {
					return err
				}
			}
			if delay < 0 {
				return fmt.Errorf("--delay must not be negative, got %s", delay)
			}
			if wait && timeout <= 0 {
				return fmt.Errorf("--timeout must be positive, got %s", timeout)
			}
			var opts []flo.InvokeOption
			if idempotencyKey != "" {
				opts = append(opts, flo.WithIdempotencyKey(idempotencyKey))
			}
			if priority != 0 {
				opts = append(opts, flo.WithPriority(priority))
			}
			if delay > 0 {
				opts = append(opts, flo.WithDelay(delay))
			}
			return g.withClient(func(c *flo.Client) error {
				id, err := c.Invoke(cmd.Context(), args[0], payload, opts...)
				if err != nil {
					return err
				}
				if !wait {
					return printJSON(cmd, map[string]string{"task_id": id})
				}
				return awaitTask(cmd, c, id, timeout+delay)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&idempotencyKey, "idempotency-key", "", "invoking again with the same key returns the same task")
	f.IntVar(&priority, "priority", 0, "higher priority tasks run first")
	f.DurationVar(&delay, "delay", 0, "run the task no sooner than this, e.g. 5s")
	f.BoolVar(&wait, "wait", false, "wait for the task to finish and print it")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "with --wait, how long to wait (added to --delay)")
	return cmd
}

// parsePayload checks the JSON argument here, so a typo costs no round trip and is reported
// plainly.
func parsePayload(s string) (json.RawMessage, error) {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("invalid JSON payload: %w", err)
	}
	return json.RawMessage(s), nil
}
