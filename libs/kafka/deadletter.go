package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/razorbill/flo/libs/retry"
	"github.com/razorbill/flo/libs/text"

	"github.com/razorbill/flo/libs/config"
)

// Headers a Consumer adds to a dead-lettered record, next to the record's
// own headers.
const (
	// HeaderError is why the record was dead-lettered.
	HeaderError = "flo.dlq.error"
	// HeaderTopic is the topic the record came from.
	HeaderTopic = "flo.dlq.topic"
	// HeaderPartition is its partition there, in decimal.
	HeaderPartition = "flo.dlq.partition"
	// HeaderOffset is its offset there, in decimal.
	HeaderOffset = "flo.dlq.offset"
	// HeaderGroup is the consumer group that could not handle it.
	HeaderGroup = "flo.dlq.group"
	// HeaderReplayedFrom is set on a record Replay put back into its
	// source topic: "<dead-letter topic>/<partition>/<offset>". It stays
	// on the record, so a record dead-lettered again after a replay says
	// so.
	HeaderReplayedFrom = "flo.dlq.replayed-from"
	// HeaderReplayOf marks a record of a dead-letter topic as Replay's
	// note that the record at "<partition>/<offset>" was replayed; it has
	// no value.
	HeaderReplayOf = "flo.dlq.replay-of"
)

// dlqHeaders are the headers of the dead-letter envelope, dropped again when
// a record is replayed or dead-lettered anew.
var dlqHeaders = []string{HeaderError, HeaderTopic, HeaderPartition, HeaderOffset, HeaderGroup}

// maxErrorHeader bounds the error text a dead-lettered record carries, so an
// enormous error cannot make the record too large for the dead-letter topic.
const maxErrorHeader = 4 << 10

// deadLetterPartitions is the partition count of the dead-letter topics we
// create: they are low volume, and one partition makes an offset name one
// record, which is how `flo dlq replay` picks them.
const deadLetterPartitions = 1

// DeadLetterTopic returns the dead-letter topic of topic.
func DeadLetterTopic(topic string) string { return topic + DeadLetterSuffix }

// poisonCounter counts records isolated by a consumer or a tail, through
// the global meter provider like the consumer's lag.
func poisonCounter(name, desc string) (metric.Int64Counter, error) {
	c, err := otel.Meter("github.com/razorbill/flo/libs/kafka").Int64Counter(name, metric.WithUnit("{record}"), metric.WithDescription(desc))
	if err != nil {
		return nil, fmt.Errorf("create metric %s: %w", name, err)
	}
	return c, nil
}

// DeadLetterer writes the records a consumer group cannot handle to their
// topic's dead-letter topic.
type DeadLetterer struct {
	cl      *kgo.Client
	group   string
	log     *slog.Logger
	counter metric.Int64Counter

	mu      sync.Mutex
	created map[string]bool
}

// NewDeadLetterer returns a DeadLetterer writing through cl on behalf of
// group (a consumer group, or a service that reads a topic by itself).
func NewDeadLetterer(cl *kgo.Client, group string, log *slog.Logger) (*DeadLetterer, error) {
	counter, err := poisonCounter("flo.consumer.dead_lettered",
		"Records a consumer group could not handle, written to their topic's dead-letter topic (<topic>.dlq).")
	if err != nil {
		return nil, err
	}
	return &DeadLetterer{cl: cl, group: group, log: log, created: map[string]bool{}, counter: counter}, nil
}

// DeadLetter writes r with cause to its dead-letter topic and waits for the
// broker's acknowledgement, trying again for as long as that fails: the
// source offset may be committed past r only once r is safe elsewhere. It
// reports false when ctx ended first.
func (d *DeadLetterer) DeadLetter(ctx context.Context, r *kgo.Record, cause error) bool {
	topic := DeadLetterTopic(r.Topic)
	rec := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: withoutHeaders(r.Headers, dlqHeaders...)}
	msg := text.Clean(cause.Error(), maxErrorHeader)
	rec.Headers = append(rec.Headers,
		kgo.RecordHeader{Key: HeaderError, Value: []byte(msg)},
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.FormatInt(int64(r.Partition), 10))},
		kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		kgo.RecordHeader{Key: HeaderGroup, Value: []byte(d.group)})
	rctx := ExtractTrace(ctx, r)
	err := retry.Do(ctx, transientRetry, func() error {
		if err := d.ensure(ctx, topic); err != nil {
			return err
		}
		return d.cl.ProduceSync(ctx, rec).FirstErr()
	}, func(err error, attempt int, wait time.Duration) {
		d.log.ErrorContext(rctx, "dead-letter record failed; retrying", "topic", r.Topic, "partition", r.Partition,
			"offset", r.Offset, "dead_letter_topic", topic, "attempt", attempt, "retry_in", wait, "error", err)
	})
	if err != nil {
		return false
	}
	d.counter.Add(ctx, 1, metric.WithAttributes(attribute.String("topic", r.Topic), attribute.String("group", d.group)))
	// d.log names the group.
	d.log.ErrorContext(rctx, "record dead-lettered", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
		"dead_letter_topic", topic, "error", cause)
	return true
}

// ensure creates topic before its first record, with one partition, as
// EnsureTopics creates every other topic (and not with whatever defaults a
// broker's auto-creation has).
func (d *DeadLetterer) ensure(ctx context.Context, topic string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.created[topic] {
		return nil
	}
	if err := EnsureTopics(ctx, d.cl, deadLetterPartitions, topic); err != nil {
		return err
	}
	d.created[topic] = true
	return nil
}

// skipper is a tail's reject: every replica reads every record of a tail, so
// a record it cannot handle is logged and counted, never dead-lettered.
type skipper struct {
	log     *slog.Logger
	counter metric.Int64Counter
}

func newSkipper(log *slog.Logger) (*skipper, error) {
	counter, err := poisonCounter("flo.tail.skipped",
		"Records a group-less tail could not handle and skipped (tails never dead-letter: every replica reads every record).")
	if err != nil {
		return nil, err
	}
	return &skipper{log: log, counter: counter}, nil
}

func (s *skipper) skip(ctx context.Context, r *kgo.Record, cause error) bool {
	s.counter.Add(ctx, 1, metric.WithAttributes(attribute.String("topic", r.Topic)))
	s.log.ErrorContext(ExtractTrace(ctx, r), "tail skipped record", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "error", cause)
	return true
}

func withoutHeaders(hs []kgo.RecordHeader, drop ...string) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, 0, len(hs))
	for _, h := range hs {
		if !slices.Contains(drop, h.Key) {
			out = append(out, h)
		}
	}
	return out
}

func header(hs []kgo.RecordHeader, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// DeadLetter is a record of a dead-letter topic and what its headers say.
type DeadLetter struct {
	Partition int32
	Offset    int64
	Timestamp time.Time
	// SourceTopic, SourcePartition and SourceOffset say where the record
	// was when it could not be handled.
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	Group           string
	Error           string
	Key             []byte
	Value           []byte
	// Headers are the record's own headers, without the dead-letter ones.
	Headers map[string]string
	// Replays are when Replay put the record back, oldest first.
	Replays []time.Time

	headers []kgo.RecordHeader
}

// ReadDeadLetters reads the dead-letter topic from its start to its current
// end and returns its records, oldest first; the notes Replay leaves are
// folded into the records they name. It fails when the topic does not exist.
func ReadDeadLetters(ctx context.Context, conn config.Kafka, topic string) ([]*DeadLetter, error) {
	if !strings.HasSuffix(topic, DeadLetterSuffix) {
		return nil, fmt.Errorf("read dead letters: %s is not a dead-letter topic (<topic>%s)", topic, DeadLetterSuffix)
	}
	cl, err := newClient(conn)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	var starts kadm.ListedOffsets
	if err == nil {
		if starts, err = adm.ListStartOffsets(ctx, topic); err == nil {
			err = starts.Error()
		}
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) || (err == nil && len(ends[topic]) == 0) {
		return nil, fmt.Errorf("read dead letters: topic %s does not exist: nothing was dead-lettered there yet, or the name is wrong", topic)
	}
	if err != nil {
		return nil, fmt.Errorf("read dead letters of %s: %w", topic, err)
	}
	from := map[int32]kgo.Offset{}
	left := map[int32]int64{}
	for p, o := range ends[topic] {
		// A partition emptied by retention has nothing to wait for.
		if start, ok := starts.Lookup(topic, p); ok && start.Offset < o.Offset {
			from[p] = kgo.NewOffset().At(start.Offset)
			left[p] = o.Offset
		}
	}
	var (
		letters []*DeadLetter
		byPlace = map[string]*DeadLetter{}
		replays []*kgo.Record
	)
	if len(from) > 0 {
		cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: from})
	}
	for len(left) > 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read dead letters of %s: %w", topic, ctx.Err())
		}
		if err := fetches.Err(); err != nil {
			return nil, fmt.Errorf("read dead letters of %s: %w", topic, err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset >= end-1 {
				delete(left, r.Partition)
			}
			if r.Offset >= ends[topic][r.Partition].Offset {
				return
			}
			if header(r.Headers, HeaderReplayOf) != "" {
				replays = append(replays, r)
				return
			}
			dl := newDeadLetter(r)
			letters = append(letters, dl)
			byPlace[place(r.Partition, r.Offset)] = dl
		})
	}
	for _, r := range replays {
		if dl := byPlace[header(r.Headers, HeaderReplayOf)]; dl != nil {
			dl.Replays = append(dl.Replays, r.Timestamp)
		}
	}
	slices.SortStableFunc(letters, func(a, b *DeadLetter) int {
		return a.Timestamp.Compare(b.Timestamp)
	})
	return letters, nil
}

func newDeadLetter(r *kgo.Record) *DeadLetter {
	dl := &DeadLetter{
		Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
		SourceTopic: header(r.Headers, HeaderTopic), Group: header(r.Headers, HeaderGroup), Error: header(r.Headers, HeaderError),
		Key: r.Key, Value: r.Value, Headers: map[string]string{},
		headers: withoutHeaders(r.Headers, dlqHeaders...),
	}
	if dl.SourceTopic == "" {
		dl.SourceTopic = strings.TrimSuffix(r.Topic, DeadLetterSuffix)
	}
	if p, err := strconv.ParseInt(header(r.Headers, HeaderPartition), 10, 32); err == nil {
		dl.SourcePartition = int32(p)
	}
	if o, err := strconv.ParseInt(header(r.Headers, HeaderOffset), 10, 64); err == nil {
		dl.SourceOffset = o
	}
	for _, h := range dl.headers {
		dl.Headers[h.Key] = string(h.Value)
	}
	return dl
}

func place(partition int32, offset int64) string { return fmt.Sprintf("%d/%d", partition, offset) }

// Replay produces each of letters, records of the dead-letter topic topic,
// back into its source topic with its key, value and own headers, plus
// HeaderReplayedFrom, and then notes the replay in the dead-letter topic
// (which ReadDeadLetters reports in Replays), waiting for the broker's
// acknowledgement of each. Replaying a record twice is possible (consumers
// are idempotent) but shows in Replays.
func Replay(ctx context.Context, conn config.Kafka, topic string, letters []*DeadLetter) error {
	if len(letters) == 0 {
		return nil
	}
	cl, err := newClient(conn)
	if err != nil {
		return err
	}
	defer cl.Close()
	replayed := make([]*kgo.Record, len(letters))
	notes := make([]*kgo.Record, len(letters))
	for i, dl := range letters {
		from := place(dl.Partition, dl.Offset)
		hs := append(withoutHeaders(dl.headers, HeaderReplayedFrom),
			kgo.RecordHeader{Key: HeaderReplayedFrom, Value: []byte(topic + "/" + from)})
		replayed[i] = &kgo.Record{Topic: dl.SourceTopic, Key: dl.Key, Value: dl.Value, Headers: hs}
		notes[i] = &kgo.Record{Topic: topic, Headers: []kgo.RecordHeader{{Key: HeaderReplayOf, Value: []byte(from)}}}
	}
	if err := cl.ProduceSync(ctx, replayed...).FirstErr(); err != nil {
		return fmt.Errorf("replay %d records of %s: %w", len(letters), topic, err)
	}
	if err := cl.ProduceSync(ctx, notes...).FirstErr(); err != nil {
		return fmt.Errorf("note the replay of %d records in %s (they were replayed): %w", len(letters), topic, err)
	}
	return nil
}

// Selection names the records of a dead-letter topic to replay.
type Selection struct {
	// Offsets are the records' offsets in the dead-letter topic.
	Offsets []int64
	// All takes every record not replayed before.
	All bool
	// Again allows records that were replayed before.
	Again bool
}

// ReplayDeadLetters reads the dead-letter topic topic, picks the records sel
// names and replays them (Replay); it returns those it replayed. A record
// replayed before is refused unless sel.Again is set, so replaying one twice
// by mistake takes a deliberate flag.
func ReplayDeadLetters(ctx context.Context, conn config.Kafka, topic string, sel Selection) ([]*DeadLetter, error) {
	if sel.All == (len(sel.Offsets) > 0) {
		return nil, errors.New("replay dead letters: name the offsets to replay, or all of them")
	}
	letters, err := ReadDeadLetters(ctx, conn, topic)
	if err != nil {
		return nil, err
	}
	var picked []*DeadLetter
	if sel.All {
		for _, dl := range letters {
			if sel.Again || len(dl.Replays) == 0 {
				picked = append(picked, dl)
			}
		}
	}
	for _, o := range sel.Offsets {
		i := slices.IndexFunc(letters, func(dl *DeadLetter) bool { return dl.Offset == o })
		if i < 0 {
			return nil, fmt.Errorf("replay dead letters: %s has no record at offset %d", topic, o)
		}
		dl := letters[i]
		if len(dl.Replays) > 0 && !sel.Again {
			return nil, fmt.Errorf("replay dead letters: the record at offset %d of %s was replayed at %s; replay it again on purpose with again",
				o, topic, dl.Replays[len(dl.Replays)-1].UTC().Format(time.RFC3339))
		}
		picked = append(picked, dl)
	}
	if err := Replay(ctx, conn, topic, picked); err != nil {
		return nil, err
	}
	return picked, nil
}
