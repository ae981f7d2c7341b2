package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/query"
)

// insertAttributes queues the search attributes of new runs, so they commit
// with the runs.
func (w *Writes) insertAttributes(runs []*Run) {
	var (
		ids, namespaces, workflows, names []string
		strs                              []*string
		nums                              []*float64
		tss                               []pgtype.Timestamptz
	)
	for _, r := range runs {
		for _, a := range r.Attributes {
			ids, namespaces, workflows, names = append(ids, r.ID), append(namespaces, r.Namespace), append(workflows, r.Workflow), append(names, a.Name)
			var (
				s  *string
				n  *float64
				ts pgtype.Timestamptz
			)
			switch a.Type {
			case definition.AttributeString:
				s = &a.Str
			case definition.AttributeNumber:
				n = &a.Num
			case definition.AttributeTimestamp:
				ts = nullTime(a.Time)
			}
			strs, nums, tss = append(strs, s), append(nums, n), append(tss, ts)
		}
	}
	if len(ids) == 0 {
		return
	}
	w.queue(fmt.Sprintf("insert %d search attributes", len(ids)), `
INSERT INTO run_attributes (run_id, namespace, workflow, name, str, num, ts)
SELECT * FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::float8[], $7::timestamptz[])`,
		ids, namespaces, workflows, names, strs, nums, tss)
}

// loadAttributes reads the search attributes of runs into them, by name.
func loadAttributes(ctx context.Context, db DB, runs []*Run) error {
	if len(runs) == 0 {
		return nil
	}
	byID := make(map[string]*Run, len(runs))
	ids := make([]string, len(runs))
	for i, r := range runs {
		byID[r.ID], ids[i] = r, r.ID
	}
	rows, err := db.Query(ctx, `
SELECT run_id::text, name, str, num, ts FROM run_attributes WHERE run_id = ANY($1::text[]::uuid[]) ORDER BY run_id, name`, ids)
	if err != nil {
		return fmt.Errorf("read search attributes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id  string
			a   definition.AttributeValue
			str *string
			num *float64
			ts  pgtype.Timestamptz
		)
		if err := rows.Scan(&id, &a.Name, &str, &num, &ts); err != nil {
			return fmt.Errorf("read search attributes: %w", err)
		}
		switch {
		case str != nil:
			a.Type, a.Str = definition.AttributeString, *str
		case num != nil:
			a.Type, a.Num = definition.AttributeNumber, *num
		default:
			a.Type, a.Time = definition.AttributeTimestamp, ts.Time.UTC()
		}
		r := byID[id]
		r.Attributes = append(r.Attributes, a)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read search attributes: %w", err)
	}
	return nil
}

// InsertDeclaredAttributes records the search attributes a new workflow
// version declares; queries are checked against them.
func InsertDeclaredAttributes(ctx context.Context, tx pgx.Tx, namespace, workflow, version string, attrs []definition.SearchAttribute) error {
	if len(attrs) == 0 {
		return nil
	}
	names, types := make([]string, len(attrs)), make([]string, len(attrs))
	for i, a := range attrs {
		names[i], types[i] = a.Name, string(a.Type)
	}
	if _, err := tx.Exec(ctx, `
INSERT INTO workflow_attributes (namespace, workflow, version, name, type)
SELECT $1, $2, $3, a.name, a.type FROM unnest($4::text[], $5::text[]) AS a(name, type)`,
		namespace, workflow, version, names, types); err != nil {
		return fmt.Errorf("record search attributes of workflow %s version %s: %w", workflow, version, err)
	}
	return nil
}

// DeclaredAttributes returns the search attributes that any version of the
// given workflows declares, with their types; every workflow of the
// namespace when workflows is nil.
func DeclaredAttributes(ctx context.Context, db DB, namespace string, workflows []string) (query.Declared, error) {
	rows, err := db.Query(ctx, `
SELECT DISTINCT name, type FROM workflow_attributes
WHERE namespace = $1 AND ($2::text[] IS NULL OR workflow = ANY($2))
ORDER BY name, type`, namespace, workflows)
	if err != nil {
		return nil, fmt.Errorf("read declared search attributes: %w", err)
	}
	defer rows.Close()
	out := query.Declared{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, fmt.Errorf("read declared search attributes: %w", err)
		}
		out[name] = append(out[name], definition.AttributeType(typ))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read declared search attributes: %w", err)
	}
	return out, nil
}

// whereSQL compiles a checked query (package query) into a condition on
// runs, appending every literal to args as a parameter: no value is ever
// written into the SQL text. Each attribute comparison is an EXISTS over
// run_attributes, which its (namespace, name, value) index answers; the
// namespace is parameter $1 of the statement.
func whereSQL(b *strings.Builder, e query.Expr, args *[]any) {
	switch x := e.(type) {
	case *query.Bool:
		op := " AND "
		if x.Or {
			op = " OR "
		}
		b.WriteString("(")
		whereSQL(b, x.Left, args)
		b.WriteString(op)
		whereSQL(b, x.Right, args)
		b.WriteString(")")
	case *query.Cond:
		if x.BuiltIn != "" {
			compare(b, builtInColumns[x.BuiltIn], x.Op, x.Typed[0], args)
			return
		}
		b.WriteString("(")
		for i, t := range x.Typed {
			if i > 0 {
				b.WriteString(" OR ")
			}
			b.WriteString("EXISTS (SELECT 1 FROM run_attributes a WHERE a.run_id = runs.id AND a.namespace = $1 AND a.name = ")
			b.WriteString(param(args, x.Attribute))
			b.WriteString(" AND ")
			compare(b, attributeColumns[t.Type], x.Op, t, args)
			b.WriteString(")")
		}
		b.WriteString(")")
	}
}

var (
	builtInColumns = map[string]string{
		query.FieldWorkflow: "runs.workflow", query.FieldStatus: "runs.status",
		query.FieldStartedAt: "runs.created_at", query.FieldFinishedAt: "runs.finished_at",
	}
	attributeColumns = map[definition.AttributeType]string{
		definition.AttributeString: "a.str", definition.AttributeNumber: "a.num", definition.AttributeTimestamp: "a.ts",
	}
	sqlOps = map[query.Op]string{
		query.OpEq: "=", query.OpNe: "<>", query.OpLt: "<", query.OpLe: "<=", query.OpGt: ">", query.OpGe: ">=",
	}
)

// compare writes "column op parameter", or "column = ANY(array)" for IN.
// Strings order by bytes, as run_attributes.str does, whatever the
// database's collation.
func compare(b *strings.Builder, column string, op query.Op, t query.Typed, args *[]any) {
	b.WriteString(column)
	if op == query.OpIn {
		b.WriteString(" = ANY(")
		switch t.Type {
		case definition.AttributeString:
			b.WriteString(param(args, valuesOf(t, func(v definition.AttributeValue) string { return v.Str })) + "::text[])")
		case definition.AttributeNumber:
			b.WriteString(param(args, valuesOf(t, func(v definition.AttributeValue) float64 { return v.Num })) + "::float8[])")
		case definition.AttributeTimestamp:
			b.WriteString(param(args, valuesOf(t, func(v definition.AttributeValue) time.Time { return v.Time })) + "::timestamptz[])")
		}
		return
	}
	v := t.Values[0]
	if t.Type == definition.AttributeString && op != query.OpEq && op != query.OpNe {
		b.WriteString(` COLLATE "C"`)
	}
	b.WriteString(" " + sqlOps[op] + " ")
	switch t.Type {
	case definition.AttributeString:
		b.WriteString(param(args, v.Str) + "::text")
	case definition.AttributeNumber:
		b.WriteString(param(args, v.Num) + "::float8")
	case definition.AttributeTimestamp:
		b.WriteString(param(args, v.Time) + "::timestamptz")
	}
}

// valuesOf lists the field get reads of each of t's values, for an IN array.
func valuesOf[T any](t query.Typed, get func(definition.AttributeValue) T) []T {
	out := make([]T, len(t.Values))
	for i, v := range t.Values {
		out[i] = get(v)
	}
	return out
}

// param adds v to args and returns its placeholder.
func param(args *[]any, v any) string {
	*args = append(*args, v)
	return "$" + strconv.Itoa(len(*args))
}
