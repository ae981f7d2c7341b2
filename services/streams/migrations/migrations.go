// Package migrations embeds the streams service's SQL migrations (goose
// format), applied at start by pg.Migrate into the "streams" schema.
package migrations

import "embed"

// FS holds the migration files at its root.
//
//go:embed *.sql
var FS embed.FS
