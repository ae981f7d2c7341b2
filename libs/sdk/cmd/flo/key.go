package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

func newKeyCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("key", "Create, list and revoke API keys (admin only)")
	var (
		role    string
		expires string
	)
	create := &cobra.Command{
		Use:   "create --role ROLE [--namespace NS] [--expires 30d]",
		Short: "Create an API key and print its secret, which cannot be shown again",
		Long: "Create an API key of a role: admin (every namespace, namespaces and keys; no --namespace), " +
			"client, worker or read (in --namespace). The key's secret is printed once, in the JSON on " +
			"stdout; only a hash of it is stored. --expires takes days, hours or minutes (30d, 12h, 90m).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ttl, err := parseExpiry(expires)
			if err != nil {
				return err
			}
			return g.withClient(func(c *flo.Client) error {
				key, secret, err := c.CreateKey(cmd.Context(), keyNamespace(cmd, g, role), role, ttl)
				if err != nil {
					return err
				}
				if err := printJSON(cmd, struct {
					Key    *flo.Key `json:"key"`
					Secret string   `json:"secret"`
				}{key, secret}); err != nil {
					return err
				}
				fmt.Fprintln(cmd.ErrOrStderr(), "Store the secret now: it will not be shown again.")
				return nil
			})
		},
	}
	create.Flags().StringVar(&role, "role", "", "admin, client, worker or read (required)")
	create.Flags().StringVar(&expires, "expires", "", "lifetime such as 30d, 12h or 90m; none by default")
	_ = create.MarkFlagRequired("role")
	cmd.AddCommand(create)
	cmd.AddCommand(&cobra.Command{
		Use:   "list [--namespace NS]",
		Short: "List API keys, all of them unless --namespace is given",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(func(c *flo.Client) error {
				keys, err := c.ListKeys(cmd.Context(), keyNamespace(cmd, g, ""))
				if err != nil {
					return err
				}
				return printJSON(cmd, keys)
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key; gateways refuse it within seconds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				key, err := c.RevokeKey(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, key)
			})
		},
	})
	return cmd
}

// keyNamespace is the namespace a key command works in: the global namespace when it was given
// on the command line, and otherwise none for an admin key or a list (every namespace), since
// the "default" fallback of other commands does not fit there.
func keyNamespace(cmd *cobra.Command, g *globals, role string) string {
	if cmd.Flags().Changed("namespace") || (role != flo.RoleAdmin && role != "") {
		return g.namespace
	}
	return ""
}

// maxExpiryDays bounds --expires in days before it becomes a duration, which could overflow;
// the server refuses anything over ten years anyway.
const maxExpiryDays = 10 * 366

// parseExpiry reads a key lifetime: whole days ("30d") or a Go duration ("12h", "90m"); empty
// means the key does not expire.
func parseExpiry(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int64
		if n, err = strconv.ParseInt(days, 10, 64); err == nil && n > maxExpiryDays {
			return 0, fmt.Errorf("--expires %q is over ten years", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	}
	if err != nil {
		return 0, fmt.Errorf("--expires %q: want a lifetime such as 30d, 12h or 90m", s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("--expires must be positive, got %q", s)
	}
	return d, nil
}
