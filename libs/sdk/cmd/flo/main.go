// Command flo is the command line of Flo: it manages namespaces, API keys and actions, invokes actions,
// inspects tasks and dead letters, appends to and reads streams and manages their consumer
// groups, creates workflows and starts, signals and follows their runs, and lists, drains and
// deregisters workers through the gateway's gRPC API. What a script would read is printed as
// indented JSON on stdout; errors go to stderr with a non-zero exit status.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	flo "github.com/razorbill/flo-go"
)

const (
	defaultAddr = "localhost:9000"
	// maxAwait is the longest wait the server grants one AwaitTask call; longer waits are
	// made of several calls.
	maxAwait = 5 * time.Minute
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "flo: %v\n", err)
		return 1
	}
	return 0
}

// globals are the flags every command takes.
type globals struct {
	addr      string
	namespace string
	token     string
	caFile    string
}

// newRootCmd builds the whole command tree; each subcommand group adds itself with one
// AddCommand call.
func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "flo",
		Short:         "Manage and run Flo actions, tasks, streams and workflows",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", envOr("FLO_ADDR", defaultAddr), "gateway gRPC address (env FLO_ADDR)")
	root.PersistentFlags().StringVarP(&g.namespace, "namespace", "n", envOr("FLO_NAMESPACE", flo.DefaultNamespace), "namespace (env FLO_NAMESPACE)")
	root.PersistentFlags().StringVar(&g.token, "token", os.Getenv("FLO_TOKEN"), "API key sent with every call (env FLO_TOKEN)")
	root.PersistentFlags().StringVar(&g.caFile, "ca-file", os.Getenv("FLO_CA_FILE"), "CA certificate file: speak TLS to the gateway, verified against it (env FLO_CA_FILE)")

	root.AddCommand(newNamespaceCmd(g))
	root.AddCommand(newKeyCmd(g))
	root.AddCommand(newActionCmd(g))
	root.AddCommand(newTaskCmd(g))
	root.AddCommand(newStreamCmd(g))
	root.AddCommand(newWorkerCmd(g))
	root.AddCommand(newWorkflowCmd(g))
	root.AddCommand(newDevCmd())
	root.AddCommand(newOutboxCmd())
	root.AddCommand(newDeadLetterTopicsCmd())
	return root
}

// newGroupCmd returns a command that only holds subcommands. Alone it prints its help; with an
// argument that names none of its subcommands it fails, so a mistyped command in a script is an
// error rather than a help page and exit status 0.
func newGroupCmd(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		// cobra's default for the root command, which it applies only there.
		SuggestionsMinimumDistance: 2,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
				msg += fmt.Sprintf("; did you mean %q?", suggestions[0])
			}
			return errors.New(msg)
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// withClient connects a client for the command's flags, runs fn and closes the client.
func (g *globals) withClient(fn func(*flo.Client) error) error {
	opts := []flo.ClientOption{flo.WithNamespace(g.namespace), flo.WithToken(g.token)}
	if g.caFile != "" {
		opts = append(opts, flo.WithCAFile(g.caFile))
	}
	client := flo.NewClient(g.addr, opts...)
	if err := client.Connect(); err != nil {
		return err
	}
	defer client.Close()
	return fn(client)
}

// printJSON writes v as indented JSON, the output format scripts read.
func printJSON(cmd *cobra.Command, v any) error {
	// An empty list prints as [], not null, so scripts can iterate it.
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice && rv.IsNil() {
		v = []struct{}{}
	}
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// awaitTask waits up to timeout for task id to finish, in calls the server accepts, prints the
// task as it then is, and fails if it has not finished.
func awaitTask(cmd *cobra.Command, client *flo.Client, id string, timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, got %s", timeout)
	}
	ctx := cmd.Context()
	deadline := time.Now().Add(timeout)
	wait := timeout
	for {
		task, err := client.AwaitTask(ctx, id, min(wait, maxAwait))
		if err != nil {
			return err
		}
		wait = time.Until(deadline).Round(time.Millisecond)
		if task.Status.Final() || wait <= 0 {
			if err := printJSON(cmd, task); err != nil {
				return err
			}
			if !task.Status.Final() {
				return fmt.Errorf("task %s is still %s after %s", id, task.Status, timeout)
			}
			return nil
		}
	}
}
