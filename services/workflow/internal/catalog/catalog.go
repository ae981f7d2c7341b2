// Package catalog keeps workflow definitions: it creates versions from YAML
// (parsed and validated by package definition; invalid YAML stores nothing),
// reads and lists them, switches names on and off, and hands the runtime
// parsed definitions from a cache. Versions never change once created, so a
// cached definition is never stale; only the on/off switch and which version
// is the latest are read from the database each time.
package catalog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// maxCached bounds the parsed definitions held in memory; past it the cache
// starts over, which costs one parse per version in use.
const maxCached = 4096

// Catalog owns workflow definitions.
type Catalog struct {
	pool *pgxpool.Pool
	// maxVersions bounds the versions of all workflows of a namespace.
	maxVersions int
	// now is the clock schedules' fire times are computed from.
	now func() time.Time

	mu    sync.Mutex
	cache map[store.VersionKey]*definition.Definition
}

// DefaultMaxVersions is how many workflow versions (of all its workflows) a
// namespace may hold unless FLO_MAX_WORKFLOW_VERSIONS_PER_NAMESPACE says
// otherwise.
const DefaultMaxVersions = 10000

// New returns a Catalog on pool admitting at most maxVersions workflow
// versions per namespace (DefaultMaxVersions when zero).
func New(pool *pgxpool.Pool, maxVersions int) *Catalog {
	return &Catalog{pool: pool, maxVersions: cmp.Or(maxVersions, DefaultMaxVersions), now: time.Now,
		cache: map[store.VersionKey]*definition.Definition{}}
}

// SetClock sets the clock schedules' fire times are computed from.
func (c *Catalog) SetClock(now func() time.Time) { c.now = now }

// Checked is what validating a YAML source found.
type Checked struct {
	Def         *definition.Definition
	Diagnostics []definition.Diagnostic
	// Workflow is the definition as it would be stored; set when Def is.
	Workflow store.Workflow
}

// Validate checks src without storing anything. err is an Invalid fault for
// a missing namespace; a definition with errors is reported in the result,
// not as err.
func (c *Catalog) Validate(namespace, src string) (Checked, error) {
	if namespace == "" {
		return Checked{}, fault.Invalidf("namespace is required")
	}
	def, diags, _ := definition.Parse([]byte(src))
	out := Checked{Def: def, Diagnostics: diags}
	if def != nil {
		out.Workflow = workflowOf(namespace, src, def)
	}
	return out, nil
}

// Create validates src and stores it as the newest version of its workflow.
// An invalid definition returns the *definition.ValidationError (an Invalid
// fault listing every error) and stores nothing; a version that exists
// already returns store.ErrVersionExists. warnings are the definition's
// warnings.
func (c *Catalog) Create(ctx context.Context, namespace, src string) (_ store.Workflow, warnings []definition.Diagnostic, err error) {
	if namespace == "" {
		return store.Workflow{}, nil, fault.Invalidf("namespace is required")
	}
	def, diags, err := definition.Parse([]byte(src))
	if err != nil {
		return store.Workflow{}, nil, err
	}
	var stored store.Workflow
	err = pg.InTx(ctx, c.pool, func(tx pgx.Tx) error {
		if err := c.admit(ctx, tx, namespace); err != nil {
			return err
		}
		var err error
		if stored, err = store.InsertVersion(ctx, tx, workflowOf(namespace, src, def)); err != nil {
			return err
		}
		if err := store.InsertDeclaredAttributes(ctx, tx, namespace, def.Name, def.Version, def.SearchAttributes); err != nil {
			return err
		}
		return c.replaceSchedule(ctx, tx, namespace, def)
	})
	if err != nil {
		return store.Workflow{}, nil, fmt.Errorf("create workflow %s version %s: %w", def.Name, def.Version, err)
	}
	c.put(store.VersionKey{Namespace: namespace, Name: def.Name, Version: def.Version}, def)
	return stored, diags, nil
}

// admit refuses a new version past the namespace's limit. It locks the
// namespace's versions until tx ends, so creations racing for the last
// place cannot both get it.
func (c *Catalog) admit(ctx context.Context, tx pgx.Tx, namespace string) error {
	if err := pg.LockXact(ctx, tx, "flo.workflow.versions/"+namespace); err != nil {
		return err
	}
	n, err := store.CountVersions(ctx, tx, namespace)
	if err != nil {
		return err
	}
	if n >= c.maxVersions {
		return fault.Exhaustedf("namespace %s has %d workflow versions, the limit is %d (FLO_MAX_WORKFLOW_VERSIONS_PER_NAMESPACE)", namespace, n, c.maxVersions)
	}
	return nil
}

func workflowOf(namespace, src string, def *definition.Definition) store.Workflow {
	steps := append([]string(nil), def.StepOrder...)
	return store.Workflow{
		Namespace: namespace, Name: def.Name, Version: def.Version, YAML: src,
		Idempotency: string(def.Idempotency), StartTarget: StepTarget(def.Start), Steps: steps,
		Enabled: true, Latest: true,
	}
}

// StepTarget describes what a step does: its run target, or
// "waitForSignal:TYPE".
func StepTarget(s *definition.Step) string {
	switch {
	case s == nil:
		return ""
	case s.Run != nil:
		return s.Run.String()
	case s.Wait != nil:
		return "waitForSignal:" + s.Wait.Type
	}
	return ""
}

// Get reads one version of a workflow, the latest when version is empty.
func (c *Catalog) Get(ctx context.Context, namespace, name, version string) (store.Workflow, error) {
	if err := checkName(namespace, name); err != nil {
		return store.Workflow{}, err
	}
	w, err := store.GetWorkflow(ctx, c.pool, namespace, name, version)
	if errors.Is(err, pg.ErrNotFound) {
		return store.Workflow{}, NotFound(name, version)
	}
	return w, err
}

// List lists a page of a namespace's workflows: the latest version of each,
// or every version; name, when set, lists one workflow. It returns the
// token of the next page.
func (c *Catalog) List(ctx context.Context, namespace, name string, allVersions bool, p page.Page) ([]store.Workflow, string, error) {
	if namespace == "" {
		return nil, "", fault.Invalidf("namespace is required")
	}
	var after store.WorkflowKey
	if p.After != nil {
		us, err := p.Int(1)
		if err != nil {
			return nil, "", err
		}
		after = store.WorkflowKey{Name: p.After[0], CreatedAt: time.UnixMicro(us), Version: p.After[2]}
	}
	ws, err := store.ListWorkflows(ctx, c.pool, namespace, name, allVersions, after, p.Fetch())
	if err != nil {
		return nil, "", err
	}
	ws, next := page.Cut(p, ws, func(w store.Workflow) []string {
		return []string{w.Name, strconv.FormatInt(w.CreatedAt.UnixMicro(), 10), w.Version}
	})
	return ws, next, nil
}

// SetEnabled lets new runs of every version of a workflow start, or refuses
// them, and returns the latest version. Running runs are not affected. The
// workflow's schedule pauses with it and resumes from now.
func (c *Catalog) SetEnabled(ctx context.Context, namespace, name string, enabled bool) (store.Workflow, error) {
	if err := checkName(namespace, name); err != nil {
		return store.Workflow{}, err
	}
	err := pg.InTx(ctx, c.pool, func(tx pgx.Tx) error {
		if err := store.SetEnabled(ctx, tx, namespace, name, enabled); err != nil {
			return err
		}
		return c.switchSchedule(ctx, tx, namespace, name, enabled)
	})
	if err != nil {
		if errors.Is(err, pg.ErrNotFound) {
			return store.Workflow{}, NotFound(name, "")
		}
		return store.Workflow{}, err
	}
	return c.Get(ctx, namespace, name, "")
}

// Definitions returns the parsed definitions of the given versions, from
// the cache or read through db; versions that do not exist are absent. A
// stored version that no longer parses (a stricter validator after an
// upgrade) is an error, since runs of it cannot advance.
func (c *Catalog) Definitions(ctx context.Context, db store.DB, keys []store.VersionKey) (map[store.VersionKey]*definition.Definition, error) {
	out := make(map[store.VersionKey]*definition.Definition, len(keys))
	var missing []store.VersionKey
	c.mu.Lock()
	for _, k := range keys {
		if d, ok := c.cache[k]; ok {
			out[k] = d
		} else {
			missing = append(missing, k)
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	sources, err := store.VersionYAML(ctx, db, missing)
	if err != nil {
		return nil, err
	}
	for k, src := range sources {
		def, _, err := definition.Parse([]byte(src))
		if err != nil {
			return nil, fmt.Errorf("parse stored workflow %s version %s: %w", k.Name, k.Version, err)
		}
		c.put(k, def)
		out[k] = def
	}
	return out, nil
}

func (c *Catalog) put(k store.VersionKey, def *definition.Definition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cache) >= maxCached {
		clear(c.cache)
	}
	c.cache[k] = def
}

func checkName(namespace, name string) error {
	switch {
	case namespace == "":
		return fault.Invalidf("namespace is required")
	case name == "":
		return fault.Invalidf("name is required")
	}
	return nil
}

// NotFound is the caller-facing error for a workflow (version empty) or one
// of its versions that does not exist.
func NotFound(name, version string) error {
	if version == "" {
		return fault.NotFoundf("workflow %s not found", name)
	}
	return fault.NotFoundf("workflow %s version %s not found", name, version)
}
