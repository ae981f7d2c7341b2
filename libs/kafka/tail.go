package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/razorbill/flo/libs/retry"

	"github.com/razorbill/flo/libs/config"
)

// Tail reads topics from their current end without a consumer group, so
// every replica sees every record. It is meant for in-memory wake-ups such
// as "task X finished", where history does not matter.
type Tail struct {
	cl     *kgo.Client
	topics []string
	h      *isolator
	log    *slog.Logger
	ready  chan struct{}

	// mu guards reading and demand's counts. It is held through a listing
	// of offsets, so that followers arriving meanwhile wait for the same
	// one.
	mu sync.Mutex
	// reading holds the partitions read, by topic; nil while not reading.
	reading map[string][]int32
	// demand is set by ReadOnDemand; nil for a tail that always reads.
	demand *demand
}

// demand is the state of a tail that reads only while followed.
type demand struct {
	// idle is how long the tail goes on reading after its last follower
	// stopped, so that a steady trickle of followers does not make it list
	// offsets for each one.
	idle      time.Duration
	followers int
	// idleSince numbers each time the followers fell to none; a stop timer
	// set then acts only if it is still the latest.
	idleSince uint64
}

// partitionsRefresh is how often a reading tail looks for partitions added
// to its topics (a repartition of the task topics), which it then reads
// from their start: every record in them is newer than the tail's reading.
const partitionsRefresh = 10 * time.Second

// topicWait is how often a tail asks again for the end offsets of topics
// that do not exist yet.
var topicWait = retry.Policy{Initial: 100 * time.Millisecond, Max: time.Second}

// NewTail returns a tail over topics; nothing is read until Run. h runs
// behind the same chain as a Consumer's handler, but a record it cannot
// handle even alone is skipped with an error log and counted as
// flo.tail.skipped by topic: every replica reads every record of a tail, so
// none of them may dead-letter it.
func NewTail(conn config.Kafka, topics []string, h BatchHandler, log *slog.Logger) (*Tail, error) {
	if len(topics) == 0 {
		// kadm would list every topic of the cluster instead.
		return nil, errors.New("new tail: no topics")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// No topic auto-creation: a reader must not create a topic with
	// whatever defaults the broker has, and Ready then means the same with
	// a dev broker as with a production one.
	// Read committed: the dispatcher writes task events in transactions, and a
	// record of an aborted one never happened.
	cl, err := newClient(conn, kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), PooledFetches())
	if err != nil {
		return nil, fmt.Errorf("new tail: %w", err)
	}
	log = log.With("tail", topics)
	skip, err := newSkipper(log)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("new tail: %w", err)
	}
	is := &isolator{h: newChain(h, log), reject: skip.skip, log: log}
	return &Tail{cl: cl, topics: topics, h: is, log: log, ready: make(chan struct{})}, nil
}

// Run looks up the end offset of every partition of the topics (waiting, with
// a log line now and then, until all topics exist), closes Ready, then hands
// every record from those offsets on to the handler, partition batch by
// partition batch, through the handler chain (see NewTail); a tail reading on
// demand starts reading only when followed (Follow). While it reads it looks
// for partitions added to the topics every partitionsRefresh and reads them
// from their start. It returns nil when ctx ends and closes the client.
func (t *Tail) Run(ctx context.Context) error {
	defer t.cl.Close()
	start, err := t.endOffsets(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if t.demand == nil {
		t.mu.Lock()
		t.read(start)
		t.mu.Unlock()
	}
	close(t.ready)
	refreshCtx, stopRefresh := context.WithCancel(ctx)
	refreshed := make(chan struct{})
	go func() {
		defer close(refreshed)
		t.refreshPartitions(refreshCtx)
	}()
	defer func() {
		stopRefresh()
		<-refreshed
	}()
	for {
		fetches := t.cl.PollRecords(ctx, maxPollRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		logFetchErrors(ctx, t.log, fetches)
		stopped := false
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if stopped || len(p.Records) == 0 {
				return
			}
			stopped = !t.h.handle(ctx, p.Records)
		})
		recycle(fetches)
		if stopped {
			return nil
		}
	}
}

// Ready is closed by Run once it knows the end offset of every partition of
// every topic and consumes from exactly there: any record whose produce was
// acknowledged after Ready closed reaches the handler (records produced
// before may too). The tail never creates topics, so Ready stays open while
// a topic does not exist yet (call EnsureTopics first to not depend on the
// producing service), and forever if Run is never called or ends first.
func (t *Tail) Ready() <-chan struct{} { return t.ready }

// ReadOnDemand makes t read only while someone follows it (Follow) and for
// idle after the last follower stopped; in between it fetches nothing. A
// tail that wakes a few waiting requests need not read every record of a
// busy topic while no request waits. Call it before Run.
func (t *Tail) ReadOnDemand(idle time.Duration) {
	t.demand = &demand{idle: idle}
}

// Follow makes sure t reads, and returns once it does: every record committed
// after Follow returns reaches the handler until stop is called. A tail that
// was not reading lists the topics' committed end offsets and reads from
// there, which takes a round trip to the broker; Follow then fails if ctx
// ends or the listing fails. Follow waits for Ready. On a tail that always
// reads it returns once Ready, and stop does nothing.
func (t *Tail) Follow(ctx context.Context) (stop func(), err error) {
	select {
	case <-t.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("follow tail: %w", ctx.Err())
	}
	d := t.demand
	if d == nil {
		return func() {}, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reading == nil {
		start, err := t.listEnds(ctx)
		if err != nil {
			return nil, fmt.Errorf("follow tail: %w", err)
		}
		t.read(start)
	}
	d.followers++
	var once sync.Once
	return func() { once.Do(t.unfollow) }, nil
}

// unfollow counts a follower out; the last one out sets a timer that stops
// the reading unless a follower came meanwhile.
func (t *Tail) unfollow() {
	d := t.demand
	t.mu.Lock()
	defer t.mu.Unlock()
	d.followers--
	if d.followers > 0 {
		return
	}
	d.idleSince++
	at := d.idleSince
	time.AfterFunc(d.idle, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if d.followers > 0 || d.idleSince != at || t.reading == nil {
			return
		}
		// Records fetched already may still reach the handler; they
		// wake no one.
		t.cl.RemoveConsumePartitions(t.reading)
		t.reading = nil
	})
}

// read starts reading partitions from the offsets given and adds them to
// t.reading. The caller holds t.mu.
func (t *Tail) read(from map[string]map[int32]kgo.Offset) {
	if t.reading == nil {
		t.reading = make(map[string][]int32, len(from))
	}
	for topic, ps := range from {
		for p := range ps {
			t.reading[topic] = append(t.reading[topic], p)
		}
	}
	t.cl.AddConsumePartitions(from)
}

// refreshPartitions adds, every partitionsRefresh until ctx ends, the
// partitions of the tail's topics it does not read while it reads.
func (t *Tail) refreshPartitions(ctx context.Context) {
	tick := time.NewTicker(partitionsRefresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := t.addNewPartitions(ctx); err != nil && ctx.Err() == nil {
			t.log.WarnContext(ctx, "tail could not look for new partitions", "error", err)
		}
	}
}

// addNewPartitions reads, from their start, the partitions of the tail's
// topics it does not read, if it reads.
func (t *Tail) addNewPartitions(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reading == nil {
		return nil
	}
	// A metadata request of its own: kadm answers from the client's cache,
	// which learns of new partitions only when the client refreshes it.
	req := kmsg.NewPtrMetadataRequest()
	for _, topic := range t.topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, t.cl)
	if err != nil {
		return err
	}
	added := map[string]map[int32]kgo.Offset{}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil || rt.Topic == nil {
			continue
		}
		for _, rp := range rt.Partitions {
			if slices.Contains(t.reading[*rt.Topic], rp.Partition) {
				continue
			}
			if added[*rt.Topic] == nil {
				added[*rt.Topic] = map[int32]kgo.Offset{}
			}
			added[*rt.Topic][rp.Partition] = kgo.NewOffset().AtStart()
		}
	}
	if len(added) > 0 {
		t.log.InfoContext(ctx, "tail reads partitions added to its topics", "partitions", added)
		t.read(added)
	}
	return nil
}

// endOffsets lists the current end offsets, retrying until every topic
// exists or ctx ends.
func (t *Tail) endOffsets(ctx context.Context) (map[string]map[int32]kgo.Offset, error) {
	var start map[string]map[int32]kgo.Offset
	err := retry.Do(ctx, topicWait, func() error {
		var err error
		start, err = t.listEnds(ctx)
		return err
	}, func(err error, attempt int, _ time.Duration) {
		if attempt == 1 || attempt%10 == 0 {
			t.log.InfoContext(ctx, "tail waiting for topics", "attempt", attempt, "error", err)
		}
	})
	if err != nil {
		return nil, err
	}
	return start, nil
}

// listEnds lists the committed end offset (the last stable offset) of every
// partition of the topics: the tail reads committed records only, and a
// record of a transaction still open below the high watermark must not be
// skipped once it commits.
func (t *Tail) listEnds(ctx context.Context) (map[string]map[int32]kgo.Offset, error) {
	listed, err := kadm.NewClient(t.cl).ListCommittedOffsets(ctx, t.topics...)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		return nil, err
	}
	start := make(map[string]map[int32]kgo.Offset, len(t.topics))
	for _, topic := range t.topics {
		ps, ok := listed[topic]
		if !ok || len(ps) == 0 {
			return nil, fmt.Errorf("topic %s: no partitions", topic)
		}
		start[topic] = make(map[int32]kgo.Offset, len(ps))
		for p, o := range ps {
			start[topic][p] = kgo.NewOffset().At(o.Offset)
		}
	}
	return start, nil
}
