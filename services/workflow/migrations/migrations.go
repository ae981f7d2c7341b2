// Package migrations embeds the workflow service's SQL migrations (goose
// format), applied at start by pg.Migrate into the "workflow" schema.
package migrations

import "embed"

// FS holds the migration files at its root.
//
//go:embed *.sql
var FS embed.FS
