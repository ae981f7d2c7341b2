// Package catalog manages streams and consumer groups: validation, the
// stream's log topic (created with its partitions and retention, deleted
// after the stream), group start positions, and what a stream holds and how
// far behind its groups are.
package catalog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/page"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/streams/internal/logread"
	"github.com/razorbill/flo/services/streams/internal/record"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// Limits and defaults of streams and groups.
const (
	DefaultPartitions    = 1
	MaxPartitions        = 256
	MinRetentionMS       = 60_000
	MinRetentionBytes    = 1 << 20
	DefaultMaxDeliveries = 5
	MaxMaxDeliveries     = 1000
	// DeadLetterSuffix names a stream's dead-letter stream.
	DeadLetterSuffix = ".dlq"
	// DefaultMaxStreams is how many streams a namespace may hold unless
	// FLO_MAX_STREAMS_PER_NAMESPACE says otherwise.
	DefaultMaxStreams = 1000
)

// lookupPattern accepts the names reads may use: those of text.StreamName and
// dead-letter streams, whose names are a stream's plus ".dlq" (and may so be
// longer than 128).
var lookupPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,255}$`)

// ExistsError is returned when a stream or group of that name exists.
type ExistsError struct{ Message string }

func (e *ExistsError) Error() string { return e.Message }

// validateLookup checks a name a call refers to.
func validateLookup(field, name string) error {
	if name == "" {
		return fault.Invalidf("%s is required", field)
	}
	if !lookupPattern.MatchString(name) {
		return fault.Invalidf("%s %q is invalid: use letters, digits, '.', '_' or '-', not starting with '.' or '-'", field, name)
	}
	return nil
}

func validateNamespace(ns string) error { return text.Name("namespace", ns) }

// ValidateGroupKey checks the names a call on a group refers to, so that a
// bad one is refused before it joins a transaction shared with other calls.
func ValidateGroupKey(k store.GroupKey) error {
	if err := validateNamespace(k.Namespace); err != nil {
		return err
	}
	if err := validateLookup("stream", k.Stream); err != nil {
		return err
	}
	return validateLookup("group", k.Group)
}

// Catalog manages streams and groups.
type Catalog struct {
	pool            *pgxpool.Pool
	admin           *kadm.Client
	reader          *logread.Reader
	maxMessageBytes int
	maxStreams      int
	log             *slog.Logger
	// forget is told about deleted stream topics, so caches drop them.
	forget func(s store.Stream)
}

// New returns a Catalog. cl must not create topics on first use;
// maxMessageBytes is the topics' max.message.bytes; maxStreams is how many
// streams a namespace may create (DefaultMaxStreams when zero); forget is
// called for every stream this replica deletes.
func New(pool *pgxpool.Pool, cl *kgo.Client, reader *logread.Reader, maxMessageBytes, maxStreams int, forget func(store.Stream), log *slog.Logger) *Catalog {
	return &Catalog{pool: pool, admin: kadm.NewClient(cl), reader: reader, maxMessageBytes: maxMessageBytes,
		maxStreams: cmp.Or(maxStreams, DefaultMaxStreams), forget: forget, log: log}
}

// Spec is a stream to create; zero values take the defaults.
type Spec struct {
	Namespace      string
	Name           string
	Partitions     int32
	RetentionMS    int64
	RetentionBytes int64
}

func (s *Spec) validate() error {
	if err := validateNamespace(s.Namespace); err != nil {
		return err
	}
	if err := text.StreamName("name", s.Name); err != nil {
		return err
	}
	switch {
	case s.Partitions == 0:
		s.Partitions = DefaultPartitions
	case s.Partitions < 0 || s.Partitions > MaxPartitions:
		return fault.Invalidf("partitions must be between 1 and %d, got %d", MaxPartitions, s.Partitions)
	}
	if s.RetentionMS < 0 || (s.RetentionMS > 0 && s.RetentionMS < MinRetentionMS) {
		return fault.Invalidf("retention_ms must be 0 (keep forever) or at least %d (one minute), got %d", MinRetentionMS, s.RetentionMS)
	}
	if s.RetentionBytes < 0 || (s.RetentionBytes > 0 && s.RetentionBytes < MinRetentionBytes) {
		return fault.Invalidf("retention_bytes must be 0 (no limit) or at least %d (1 MiB), got %d", MinRetentionBytes, s.RetentionBytes)
	}
	return nil
}

// CreateStream stores a stream and creates its topic in one transaction, so
// a stream exists only with its topic.
func (c *Catalog) CreateStream(ctx context.Context, spec Spec) (store.Stream, error) {
	if err := spec.validate(); err != nil {
		return store.Stream{}, err
	}
	return c.create(ctx, spec, true)
}

// create stores a stream and creates its topic; with limited it counts
// against the namespace's stream limit. Dead-letter streams do not: one per
// stream at most, and refusing one would stop a group's failing records.
func (c *Catalog) create(ctx context.Context, spec Spec, limited bool) (store.Stream, error) {
	var st store.Stream
	err := pg.InTx(ctx, c.pool, func(tx pgx.Tx) error {
		if limited {
			if err := c.admit(ctx, tx, spec.Namespace); err != nil {
				return err
			}
		}
		var err error
		st, err = store.InsertStream(ctx, tx, store.Stream{
			Namespace: spec.Namespace, Name: spec.Name, Partitions: spec.Partitions,
			RetentionMS: spec.RetentionMS, RetentionBytes: spec.RetentionBytes,
		})
		if errors.Is(err, pg.ErrConflict) {
			return &ExistsError{Message: fmt.Sprintf("stream %q already exists in namespace %q", spec.Name, spec.Namespace)}
		}
		if err != nil {
			return err
		}
		return c.createTopic(ctx, st)
	})
	return st, err
}

// admit refuses a new stream past the namespace's limit. It locks the
// namespace's streams until tx ends, so creations racing for the last place
// cannot both get it.
func (c *Catalog) admit(ctx context.Context, tx pgx.Tx, namespace string) error {
	if err := pg.LockXact(ctx, tx, "flo.streams.streams/"+namespace); err != nil {
		return err
	}
	n, err := store.CountStreams(ctx, tx, namespace)
	if err != nil {
		return err
	}
	if n >= c.maxStreams {
		return fault.Exhaustedf("namespace %s has %d streams, the limit is %d (FLO_MAX_STREAMS_PER_NAMESPACE)", namespace, n, c.maxStreams)
	}
	return nil
}

// createTopic creates the stream's topic with its partitions and retention
// (-1 where unlimited), deleting by time and size only.
func (c *Catalog) createTopic(ctx context.Context, st store.Stream) error {
	retentionMS, retentionBytes := "-1", "-1"
	if st.RetentionMS > 0 {
		retentionMS = strconv.FormatInt(st.RetentionMS, 10)
	}
	if st.RetentionBytes > 0 {
		retentionBytes = strconv.FormatInt(st.RetentionBytes, 10)
	}
	maxMessage := strconv.Itoa(c.maxMessageBytes)
	deletePolicy := "delete"
	createTime := "CreateTime"
	configs := map[string]*string{
		"retention.ms":           &retentionMS,
		"retention.bytes":        &retentionBytes,
		"max.message.bytes":      &maxMessage,
		"cleanup.policy":         &deletePolicy,
		"message.timestamp.type": &createTime,
	}
	resp, err := c.admin.CreateTopic(ctx, st.Partitions, -1, configs, st.Topic())
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("%w: create topic %s: %w", logread.ErrUnavailable, st.Topic(), err)
	}
	return nil
}

// GetStream reads a stream; an unknown one is a NotFound fault.
func (c *Catalog) GetStream(ctx context.Context, namespace, name string) (store.Stream, error) {
	if err := validateNamespace(namespace); err != nil {
		return store.Stream{}, err
	}
	if err := validateLookup("stream", name); err != nil {
		return store.Stream{}, err
	}
	st, err := store.GetStream(ctx, c.pool, namespace, name)
	if errors.Is(err, pg.ErrNotFound) {
		return store.Stream{}, streamNotFound(namespace, name)
	}
	return st, err
}

func streamNotFound(namespace, name string) error {
	return fault.NotFoundf("stream %q not found in namespace %q", name, namespace)
}

// ListStreams lists a page of a namespace's streams by name, with the token
// of the next page.
func (c *Catalog) ListStreams(ctx context.Context, namespace string, p page.Page) ([]store.Stream, string, error) {
	if err := validateNamespace(namespace); err != nil {
		return nil, "", err
	}
	sts, err := store.ListStreams(ctx, c.pool, namespace, p.Part(0), p.Fetch())
	if err != nil {
		return nil, "", err
	}
	sts, next := page.Cut(p, sts, func(st store.Stream) []string { return []string{st.Name} })
	return sts, next, nil
}

// DeleteStream deletes a stream, its groups and its records. The topic goes
// after the rows; a topic the broker did not delete is retried by Sweep.
func (c *Catalog) DeleteStream(ctx context.Context, namespace, name string) error {
	if err := validateNamespace(namespace); err != nil {
		return err
	}
	if err := validateLookup("stream", name); err != nil {
		return err
	}
	st, err := store.DeleteStream(ctx, c.pool, namespace, name)
	if errors.Is(err, pg.ErrNotFound) {
		return streamNotFound(namespace, name)
	}
	if err != nil {
		return err
	}
	if c.forget != nil {
		c.forget(st)
	}
	if err := c.dropTopics(ctx, []string{st.Topic()}); err != nil {
		c.log.WarnContext(ctx, "delete stream topic; retrying later", "topic", st.Topic(), "error", err)
	}
	return nil
}

// Sweep deletes the topics of deleted streams the broker still has, in
// batches, and returns how many it deleted.
func (c *Catalog) Sweep(ctx context.Context) (int, error) {
	const batch = 100
	topics, err := store.DroppedTopics(ctx, c.pool, batch)
	if err != nil || len(topics) == 0 {
		return 0, err
	}
	if err := c.dropTopics(ctx, topics); err != nil {
		return 0, err
	}
	return len(topics), nil
}

// dropTopics deletes topics from the broker (gone already counts as
// deleted) and forgets them.
func (c *Catalog) dropTopics(ctx context.Context, topics []string) error {
	resps, err := c.admin.DeleteTopics(ctx, topics...)
	if err != nil {
		return fmt.Errorf("delete topics: %w", err)
	}
	var done []string
	var errs []error
	for _, r := range resps {
		if r.Err == nil || errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			done = append(done, r.Topic)
			continue
		}
		errs = append(errs, fmt.Errorf("delete topic %s: %w", r.Topic, r.Err))
	}
	if len(done) > 0 {
		if err := store.ForgetDroppedTopics(ctx, c.pool, done); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeadLetters returns the dead-letter stream of st, creating it (one
// partition, st's retention) on first need.
func (c *Catalog) DeadLetters(ctx context.Context, st store.Stream) (store.Stream, error) {
	name := st.Name + DeadLetterSuffix
	for {
		dlq, err := store.GetStream(ctx, c.pool, st.Namespace, name)
		if !errors.Is(err, pg.ErrNotFound) {
			return dlq, err
		}
		dlq, err = c.create(ctx, Spec{Namespace: st.Namespace, Name: name, Partitions: 1, RetentionMS: st.RetentionMS, RetentionBytes: st.RetentionBytes}, false)
		var exists *ExistsError
		if errors.As(err, &exists) {
			continue // created concurrently; read it
		}
		return dlq, err
	}
}

// Info is a stream with what it holds and its groups.
type Info struct {
	Stream store.Stream
	// Length is the records held (appended and not removed by retention).
	Length int64
	// First and Last are the smallest and largest ids held; nil when empty.
	First, Last *record.ID
	Groups      []GroupInfo
}

// GroupInfo is a group with how far behind it is: Lag records not handed
// out yet, Pending records handed out and not settled.
type GroupInfo struct {
	Namespace, Stream string
	Group             store.Group
	Lag, Pending      int64
}

// Info describes a stream.
func (c *Catalog) Info(ctx context.Context, namespace, name string) (Info, error) {
	st, err := c.GetStream(ctx, namespace, name)
	if err != nil {
		return Info{}, err
	}
	starts, ends, err := c.bounds(ctx, st)
	if err != nil {
		return Info{}, err
	}
	info := Info{Stream: st}
	firstWants := make([]logread.Want, 0, st.Partitions)
	lastWants := make([]logread.Want, 0, st.Partitions)
	for p := range st.Partitions {
		if ends[p] > starts[p] {
			info.Length += ends[p] - starts[p]
			firstWants = append(firstWants, logread.Want{Partition: p, From: starts[p], Max: 1})
			lastWants = append(lastWants, logread.Want{Partition: p, From: ends[p] - 1, Max: 1})
		}
	}
	if len(firstWants) > 0 {
		if info.First, err = c.extreme(ctx, st.Topic(), firstWants, -1); err != nil {
			return Info{}, err
		}
		if info.Last, err = c.extreme(ctx, st.Topic(), lastWants, 1); err != nil {
			return Info{}, err
		}
	}
	states, err := store.ListGroups(ctx, c.pool, st.ID, "", 0)
	if err != nil {
		return Info{}, err
	}
	for _, gs := range states {
		info.Groups = append(info.Groups, groupInfo(st, gs, starts, ends))
	}
	return info, nil
}

// extreme reads one record per want and returns the smallest (sign -1) or
// largest (sign 1) id among them.
func (c *Catalog) extreme(ctx context.Context, topic string, wants []logread.Want, sign int) (*record.ID, error) {
	gots, err := c.reader.Read(ctx, topic, wants)
	if err != nil {
		return nil, err
	}
	var best *record.ID
	for _, g := range gots {
		for _, r := range g.Records {
			id := record.IDOf(r)
			if best == nil || id.Compare(*best) == sign {
				best = &id
			}
		}
	}
	return best, nil
}

// bounds lists the first offset held and the end of every partition.
func (c *Catalog) bounds(ctx context.Context, st store.Stream) (starts, ends []int64, err error) {
	if starts, err = c.reader.ListStarts(ctx, st.Topic(), st.Partitions); err != nil {
		return nil, nil, err
	}
	if ends, err = c.reader.ListEnds(ctx, st.Topic(), st.Partitions); err != nil {
		return nil, nil, err
	}
	return starts, ends, nil
}

func groupInfo(st store.Stream, gs store.GroupState, starts, ends []int64) GroupInfo {
	gi := GroupInfo{Namespace: st.Namespace, Stream: st.Name, Group: gs.Group, Pending: gs.Pending}
	for p, cur := range gs.Cursors {
		if p < len(ends) {
			gi.Lag += max(0, ends[p]-max(cur, starts[p]))
		}
	}
	return gi
}

// GroupSpec is a group to create.
type GroupSpec struct {
	Namespace, Stream, Name string
	// Start is "-" or empty (the first record), "$" (the next record
	// appended) or a record id to start at.
	Start         string
	MaxDeliveries int32
	// Mode is store.ModeShared (or empty), store.ModeExclusive or
	// store.ModeKeyShared.
	Mode string
}

// validMode checks a group mode, empty meaning shared.
func validMode(mode string) (string, error) {
	switch mode {
	case "":
		return store.ModeShared, nil
	case store.ModeShared, store.ModeExclusive, store.ModeKeyShared:
		return mode, nil
	}
	return "", fault.Invalidf("mode must be %q, %q or %q, got %q", store.ModeShared, store.ModeExclusive, store.ModeKeyShared, mode)
}

// CreateGroup creates a group positioned at its start.
func (c *Catalog) CreateGroup(ctx context.Context, spec GroupSpec) (GroupInfo, error) {
	if err := text.StreamName("name", spec.Name); err != nil {
		return GroupInfo{}, err
	}
	switch {
	case spec.MaxDeliveries == 0:
		spec.MaxDeliveries = DefaultMaxDeliveries
	case spec.MaxDeliveries < 0 || spec.MaxDeliveries > MaxMaxDeliveries:
		return GroupInfo{}, fault.Invalidf("max_deliveries must be between 1 and %d, got %d", MaxMaxDeliveries, spec.MaxDeliveries)
	}
	mode, err := validMode(spec.Mode)
	if err != nil {
		return GroupInfo{}, err
	}
	start, err := record.ParseStart("start", spec.Start, false)
	if err != nil {
		return GroupInfo{}, err
	}
	if err := validateNamespace(spec.Namespace); err != nil {
		return GroupInfo{}, err
	}
	if err := validateLookup("stream", spec.Stream); err != nil {
		return GroupInfo{}, err
	}
	// Every stream worker creates its group as it starts, so thousands
	// starting at once mostly find it: one read each, no failing insert.
	key := store.GroupKey{Namespace: spec.Namespace, Stream: spec.Stream, Group: spec.Name}
	switch g, err := store.GetGroup(ctx, c.pool, key); {
	case err == nil:
		return GroupInfo{}, groupExists(g, mode)
	case !errors.Is(err, pg.ErrNotFound):
		return GroupInfo{}, err
	}
	st, err := c.GetStream(ctx, spec.Namespace, spec.Stream)
	if err != nil {
		return GroupInfo{}, err
	}
	cursors, err := c.startOffsets(ctx, st, start)
	if err != nil {
		return GroupInfo{}, err
	}
	g, err := store.InsertGroup(ctx, c.pool, st.ID, spec.Name, spec.MaxDeliveries, mode, cursors)
	if errors.Is(err, pg.ErrConflict) {
		// Created meanwhile (and maybe deleted since: then it existed).
		g, err := store.GetGroup(ctx, c.pool, key)
		if err != nil {
			g = store.GroupOf{Stream: st, Group: store.Group{Name: spec.Name, Mode: mode}}
		}
		return GroupInfo{}, groupExists(g, mode)
	}
	if err != nil {
		return GroupInfo{}, err
	}
	starts, ends, err := c.bounds(ctx, st)
	if err != nil {
		return GroupInfo{}, err
	}
	return groupInfo(st, store.GroupState{Group: g, Cursors: cursors}, starts, ends), nil
}

// groupExists is the error for creating the existing group g:
// AlreadyExists, or FailedPrecondition when it has another mode, so a
// consumer that wants one mode never reads a group of another.
func groupExists(g store.GroupOf, mode string) error {
	if g.Group.Mode != mode {
		return fault.Preconditionf("group %q of stream %q exists with mode %q, not %q", g.Group.Name, g.Stream.Name, g.Group.Mode, mode)
	}
	return &ExistsError{Message: fmt.Sprintf("group %q already exists on stream %q", g.Group.Name, g.Stream.Name)}
}

// startOffsets is, per partition, the first offset a group starting at s
// reads.
func (c *Catalog) startOffsets(ctx context.Context, st store.Stream, s record.Start) ([]int64, error) {
	switch s.Kind {
	case record.FromFirst:
		// Offsets before the log start are skipped when read.
		return make([]int64, st.Partitions), nil
	case record.FromNew:
		return c.reader.ListEnds(ctx, st.Topic(), st.Partitions)
	}
	return c.OffsetsOf(ctx, st, s.ID)
}

// OffsetsOf is, per partition, the offset of the first record whose id is at
// least id. Append times do not decrease within a partition, so records at
// id's millisecond sit between the first offsets at or after ms and after
// it, and there the sequence (offset*1000+partition) decides. A record
// appended during the call may make an offset early (see ListAfter), never
// late; range reads drop what is before id.
func (c *Catalog) OffsetsOf(ctx context.Context, st store.Stream, id record.ID) ([]int64, error) {
	offsets, err := c.reader.ListAfter(ctx, st.Topic(), st.Partitions, id.MS, id.MS+1)
	if err != nil {
		return nil, err
	}
	atMS, afterMS := offsets[0], offsets[1]
	out := make([]int64, st.Partitions)
	for p := range st.Partitions {
		// The first offset o in partition p with o*1000+p >= id.Seq.
		o := (id.Seq - int64(p) + 999) / 1000
		out[p] = max(atMS[p], min(o, afterMS[p]))
	}
	return out, nil
}

// GetGroup reads a group; unknown streams and groups are NotFound faults.
func (c *Catalog) GetGroup(ctx context.Context, k store.GroupKey) (store.GroupOf, error) {
	if err := ValidateGroupKey(k); err != nil {
		return store.GroupOf{}, err
	}
	g, err := store.GetGroup(ctx, c.pool, k)
	if errors.Is(err, pg.ErrNotFound) {
		// Say which of the two is missing.
		if _, err := c.GetStream(ctx, k.Namespace, k.Stream); err != nil {
			return store.GroupOf{}, err
		}
		return store.GroupOf{}, GroupNotFound(k)
	}
	return g, err
}

// GroupNotFound is the fault for an unknown group.
func GroupNotFound(k store.GroupKey) error {
	return fault.NotFoundf("group %q not found on stream %q", k.Group, k.Stream)
}

// ListGroups lists a page of a stream's groups by name with their lag, with
// the token of the next page.
func (c *Catalog) ListGroups(ctx context.Context, namespace, stream string, p page.Page) ([]GroupInfo, string, error) {
	st, err := c.GetStream(ctx, namespace, stream)
	if err != nil {
		return nil, "", err
	}
	states, err := store.ListGroups(ctx, c.pool, st.ID, p.Part(0), p.Fetch())
	if err != nil || len(states) == 0 {
		return nil, "", err
	}
	states, next := page.Cut(p, states, func(gs store.GroupState) []string { return []string{gs.Group.Name} })
	starts, ends, err := c.bounds(ctx, st)
	if err != nil {
		return nil, "", err
	}
	out := make([]GroupInfo, len(states))
	for i, gs := range states {
		out[i] = groupInfo(st, gs, starts, ends)
	}
	return out, next, nil
}

// AllGroups lists every group of every stream with its lag: one query and
// two offset requests for all stream topics together, none retried. Groups
// of a stream whose topic the broker did not answer for are left out.
func (c *Catalog) AllGroups(ctx context.Context) ([]GroupInfo, error) {
	states, err := store.ListAllGroups(ctx, c.pool)
	if err != nil || len(states) == 0 {
		return nil, err
	}
	topics := map[string]int32{}
	for _, gs := range states {
		topics[gs.Stream.Topic()] = gs.Stream.Partitions
	}
	starts, ends, err := c.reader.ListBounds(ctx, topics)
	if err != nil {
		return nil, err
	}
	out := make([]GroupInfo, 0, len(states))
	for _, gs := range states {
		topic := gs.Stream.Topic()
		if _, ok := ends[topic]; ok {
			out = append(out, groupInfo(gs.Stream, gs.GroupState, starts[topic], ends[topic]))
		}
	}
	return out, nil
}

// DeleteGroup deletes a group with its pending records.
func (c *Catalog) DeleteGroup(ctx context.Context, k store.GroupKey) (store.Group, error) {
	g, err := c.GetGroup(ctx, k)
	if err != nil {
		return store.Group{}, err
	}
	deleted, err := store.DeleteGroup(ctx, c.pool, g.Stream.ID, k.Group)
	if errors.Is(err, pg.ErrNotFound) {
		return store.Group{}, GroupNotFound(k)
	}
	return deleted, err
}

// SweepInterval is how often dropped topics are retried.
const SweepInterval = 30 * time.Second
