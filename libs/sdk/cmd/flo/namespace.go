package main

import (
	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

func newNamespaceCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("namespace", "Create and list namespaces")
	cmd.AddCommand(&cobra.Command{
		Use:   "create NAME",
		Short: "Create a namespace",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				ns, err := c.CreateNamespace(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, ns)
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List namespaces",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(func(c *flo.Client) error {
				list, err := c.ListNamespaces(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(cmd, list)
			})
		},
	})
	return cmd
}
