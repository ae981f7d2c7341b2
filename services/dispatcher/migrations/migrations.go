// Package migrations embeds the dispatcher's SQL migrations (goose format),
// applied at start by pg.Migrate into the "dispatcher" schema.
package migrations

import "embed"

// FS holds the migration files at its root.
//
//go:embed *.sql
var FS embed.FS
