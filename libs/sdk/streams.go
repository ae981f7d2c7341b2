package flo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Stream is an append-only log of records in a namespace, read by id range or through
// consumer groups.
type Stream struct {
	Namespace string
	Name      string
	// Partitions spread the stream's records; records with the same key share one and keep
	// their order there.
	Partitions int
	// Retention is how long records are kept; zero keeps them however old they are.
	Retention time.Duration
	// RetentionBytes bounds each partition's size, oldest records going first; zero means no
	// limit.
	RetentionBytes int64
	CreatedAt      time.Time
}

// MarshalJSON writes the retention as a Go duration string ("24h0m0s"), like
// [Action.MarshalJSON] does its timeout.
func (s Stream) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Namespace      string    `json:"namespace"`
		Name           string    `json:"name"`
		Partitions     int       `json:"partitions"`
		Retention      string    `json:"retention"`
		RetentionBytes int64     `json:"retention_bytes"`
		CreatedAt      time.Time `json:"created_at,omitzero"`
	}{s.Namespace, s.Name, s.Partitions, s.Retention.String(), s.RetentionBytes, s.CreatedAt})
}

// StreamInfo is a stream with what it holds and who reads it.
type StreamInfo struct {
	Stream *Stream `json:"stream"`
	// Length counts the records held: appended and not yet removed by retention.
	Length  int64  `json:"length"`
	FirstID string `json:"first_id,omitempty"`
	LastID  string `json:"last_id,omitempty"`
	// Groups are the stream's consumer groups with their lag and pending counts.
	Groups []*ConsumerGroup `json:"groups"`
}

// Record is one record of a stream.
type Record struct {
	// ID is the record's id, "<milliseconds>-<sequence>": its append time, then its position
	// in its partition. Ids are unique in the stream and grow within a partition.
	ID      string
	Payload []byte
	Headers map[string]string
	// Key is the partition key it was appended with, if any.
	Key        string
	Partition  int
	AppendedAt time.Time
	// DeliveryCount is set on records handed out by a consumer group: how many times the
	// group has handed this one out.
	DeliveryCount int
}

// Into decodes the record's JSON payload into v. An empty payload leaves v as it is.
func (r *Record) Into(v any) error {
	if len(r.Payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(r.Payload, v); err != nil {
		return fmt.Errorf("decode payload of record %s: %w", r.ID, err)
	}
	return nil
}

// MarshalJSON writes the payload as a JSON value when it holds JSON and as a base64 string
// otherwise, like [Task.MarshalJSON].
func (r Record) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID            string            `json:"id"`
		Payload       json.RawMessage   `json:"payload,omitempty"`
		Headers       map[string]string `json:"headers,omitempty"`
		Key           string            `json:"key,omitempty"`
		Partition     int               `json:"partition"`
		AppendedAt    time.Time         `json:"appended_at,omitzero"`
		DeliveryCount int               `json:"delivery_count,omitempty"`
	}{r.ID, jsonOrBase64(r.Payload), r.Headers, r.Key, r.Partition, r.AppendedAt, r.DeliveryCount})
}

// ConsumerGroup reads a stream on its own: each record goes to one of its consumers and stays
// pending until acked.
type ConsumerGroup struct {
	Namespace string `json:"namespace"`
	Stream    string `json:"stream"`
	Name      string `json:"name"`
	// MaxDeliveries is how many times a record is handed out before it moves to the stream
	// "<stream>.dlq" and is acked.
	MaxDeliveries int `json:"max_deliveries"`
	// Mode is how the group spreads records over its consumers (see GroupOptions.Mode).
	Mode string `json:"mode"`
	// Lag counts the records not yet handed to any consumer of the group.
	Lag int64 `json:"lag"`
	// Pending counts the records handed out and not yet acked.
	Pending   int64     `json:"pending"`
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// PendingEntry is a record a group handed out and that is not acked yet.
type PendingEntry struct {
	ID            string    `json:"id"`
	Consumer      string    `json:"consumer,omitempty"`
	DeliveryCount int       `json:"delivery_count"`
	DeliveredAt   time.Time `json:"delivered_at,omitzero"`
	// RedeliverAt is when the group hands the record out again unless it is acked first.
	RedeliverAt time.Time `json:"redeliver_at,omitzero"`
}

// StreamOptions are a new stream's settings. Zero fields take the defaults: one partition,
// records kept forever.
type StreamOptions struct {
	// Partitions is how many partitions the stream has, 1 to 256.
	Partitions int
	// Retention is how long records are kept: zero or at least a minute.
	Retention time.Duration
	// RetentionBytes bounds each partition's size: zero or at least 1 MiB.
	RetentionBytes int64
}

// AppendRecord is one record to append with [Client.AppendRecords].
type AppendRecord struct {
	// Payload is sent as it is when it is a []byte or json.RawMessage, and encoded as JSON
	// otherwise.
	Payload any
	// Key picks the partition: records with the same key go to the same partition, in append
	// order. Empty spreads records over the partitions.
	Key     string
	Headers map[string]string
}

// AppendOption adjusts the records of one [Client.Append] or [Client.AppendMany] call.
type AppendOption func(*AppendRecord)

// WithKey sets the partition key: records with the same key go to the same partition and are
// read back in the order they were appended.
func WithKey(key string) AppendOption {
	return func(r *AppendRecord) { r.Key = key }
}

// WithHeaders adds headers to the record; a header set twice keeps its last value.
func WithHeaders(headers map[string]string) AppendOption {
	return func(r *AppendRecord) {
		if r.Headers == nil {
			r.Headers = make(map[string]string, len(headers))
		}
		for k, v := range headers {
			r.Headers[k] = v
		}
	}
}

// ReadOptions choose what [Client.Read] returns. The zero value reads the stream from its first
// record, up to the server's default count (100).
type ReadOptions struct {
	// Start is the first id to return: "-" or empty for the first record, "(ID" for the records
	// after ID, "$" for records appended after the call (with Block, the call waits for them),
	// or the next of an earlier read, which goes on exactly where that read ended in every
	// partition (follow a stream with it: "(ID" can miss a record that another partition got
	// in the same millisecond with a smaller id).
	Start string
	// End is the last id to return, inclusive: "+" or empty for the last record.
	End string
	// Count is the most records to return (at most 10,000); zero means 100.
	Count int
	// Tail, when not zero, returns the last Tail records instead of a range.
	Tail int
	// Block is how long a read waits for a record when its range has none yet (with no End).
	Block time.Duration
}

// GroupOptions are a new consumer group's settings.
type GroupOptions struct {
	// Start is where the group starts: "-" or empty for the stream's first record, "$" for
	// the next record appended, or a record id to start at.
	Start string
	// MaxDeliveries is how many times a record is handed out before it moves to the stream
	// "<stream>.dlq" and is acked; zero means 5.
	MaxDeliveries int
	// Mode is how the group spreads records over its consumers: GroupShared (or empty),
	// GroupExclusive or GroupKeyShared.
	Mode string
}

// Consumer group modes.
const (
	// GroupShared hands each record to any one consumer of the group (competing consumers).
	GroupShared = "shared"
	// GroupExclusive hands the whole group to one consumer at a time; when it stops reading
	// for longer than its message timeout plus its read's block time, the next consumer to
	// read takes over, with the records the first one left unacked. A stream worker's
	// consumer is its WorkerID unless Consumer names one, so a restarted worker with a new id
	// waits that long.
	GroupExclusive = "exclusive"
	// GroupKeyShared hands all records of one key to one consumer at a time, in order, while
	// different keys spread over consumers. A read holds at most one record of each key, and
	// the key's next record goes out only after that one is acked, so a worker may handle a
	// batch's records concurrently.
	GroupKeyShared = "key_shared"
)

// PendingOptions choose what [Client.ListPending] returns.
type PendingOptions struct {
	// Consumer limits the list to one consumer's records; empty lists every consumer's.
	Consumer string
	// Limit is the most entries to return; zero returns every one, a page at a time.
	Limit int
}

func (c *Client) streamService() (flov1.StreamServiceClient, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return flov1.NewStreamServiceClient(conn), nil
}

// CreateStream creates the stream name in the client's namespace.
func (c *Client) CreateStream(ctx context.Context, name string, opts StreamOptions) (*Stream, error) {
	svc, err := c.streamService()
	if err != nil {
		return nil, err
	}
	s, err := svc.CreateStream(ctx, &flov1.CreateStreamRequest{
		Namespace:      c.namespace,
		Name:           name,
		Partitions:     int32(opts.Partitions),
		RetentionMs:    opts.Retention.Milliseconds(),
		RetentionBytes: opts.RetentionBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", name, err)
	}
	return streamFromProto(s), nil
}

// GetStream returns the stream name with its length, first and last ids and consumer groups.
func (c *Client) GetStream(ctx context.Context, name string) (*StreamInfo, error) {
	svc, err := c.streamService()
	if err != nil {
		return nil, err
	}
	info, err := svc.GetStream(ctx, &flov1.GetStreamRequest{Namespace: c.namespace, Stream: name})
	if err != nil {
		return nil, fmt.Errorf("get stream %s: %w", name, err)
	}
	out := &StreamInfo{
		Stream:  streamFromProto(info.GetStream()),
		Length:  info.GetLength(),
		FirstID: info.GetFirstId(),
		LastID:  info.GetLastId(),
		Groups:  make([]*ConsumerGroup, 0, len(info.GetGroups())),
	}
	for _, g := range info.GetGroups() {
		out.Groups = append(out.Groups, groupFromProto(g))
	}
	return out, nil
}

// ListStreams returns every stream of the client's namespace.
func (c *Client) ListStreams(ctx context.Context) ([]*Stream, error) {
	svc, err := c.streamService()
	if err != nil {
		return nil, err
	}
	return listPages(0, func(size int32, token string) ([]*flov1.Stream, string, error) {
		resp, err := svc.ListStreams(ctx, &flov1.ListStreamsRequest{Namespace: c.namespace, Limit: size, PageToken: token})
		if err != nil {
			return nil, "", fmt.Errorf("list streams: %w", err)
		}
		return resp.GetStreams(), resp.GetNextPageToken(), nil
	}, streamFromProto)
}

// DeleteStream removes the stream name with its records and consumer groups.
func (c *Client) DeleteStream(ctx context.Context, name string) error {
	svc, err := c.streamService()
	if err != nil {
		return err
	}
	if _, err := svc.DeleteStream(ctx, &flov1.GetStreamRequest{Namespace: c.namespace, Stream: name}); err != nil {
		return fmt.Errorf("delete stream %s: %w", name, err)
	}
	return nil
}

// Append adds one record with payload to stream and returns its id. A []byte or
// json.RawMessage payload is sent as it is, anything else is encoded as JSON.
func (c *Client) Append(ctx context.Context, stream string, payload any, opts ...AppendOption) (string, error) {
	ids, err := c.AppendMany(ctx, stream, []any{payload}, opts...)
	if err != nil {
		return "", err
	}
	if len(ids) != 1 {
		return "", fmt.Errorf("append to stream %s: the server returned %d ids for 1 record", stream, len(ids))
	}
	return ids[0], nil
}

// AppendMany adds one record per payload to stream in a single call and returns their ids in
// payload order. Payloads are encoded as Append encodes its payload, and opts apply to every
// record.
func (c *Client) AppendMany(ctx context.Context, stream string, payloads []any, opts ...AppendOption) ([]string, error) {
	records := make([]AppendRecord, len(payloads))
	for i, p := range payloads {
		records[i].Payload = p
		for _, opt := range opts {
			opt(&records[i])
		}
	}
	return c.AppendRecords(ctx, stream, records)
}

// AppendRecords adds records to stream in a single call and returns their ids in order. The
// call succeeds or fails as a whole: a bad record appends nothing. At most 10,000 records,
// and a few MiB of them in total, fit in one call.
func (c *Client) AppendRecords(ctx context.Context, stream string, records []AppendRecord) ([]string, error) {
	if len(records) == 0 {
		return nil, nil
	}
	svc, err := c.streamService()
	if err != nil {
		return nil, err
	}
	req := &flov1.AppendRequest{Namespace: c.namespace, Stream: stream, Records: make([]*flov1.AppendRecord, len(records))}
	for i, r := range records {
		body, err := encodePayload(r.Payload)
		if err != nil {
			return nil, fmt.Errorf("append to stream %s: record %d: %w", stream, i, err)
		}
		req.Records[i] = &flov1.AppendRecord{Payload: body, Headers: r.Headers, Key: r.Key}
	}
	resp, err := svc.Append(ctx, req)
	if err != nil {
		if len(records) == 1 {
			return nil, fmt.Errorf("append to stream %s: %w", stream, err)
		}
		return nil, fmt.Errorf("append %d records to stream %s: %w", len(records), stream, err)
	}
	return resp.GetIds(), nil
}

// Read returns records of stream as opts choose, and next: the Start to pass to read on from
// where this read ended, empty when the range is exhausted.
func (c *Client) Read(ctx context.Context, stream string, opts ReadOptions) (records []*Record, next string, err error) {
	svc, err := c.streamService()
	if err != nil {
		return nil, "", err
	}
	resp, err := svc.Read(ctx, &flov1.ReadRequest{
		Namespace: c.namespace,
		Stream:    stream,
		Start:     opts.Start,
		End:       opts.End,
		Count:     int32(opts.Count),
		BlockMs:   opts.Block.Milliseconds(),
		Tail:      int32(opts.Tail),
	})
	if err != nil {
		return nil, "", fmt.Errorf("read stream %s: %w", stream, err)
	}
	records = make([]*Record, 0, len(resp.GetRecords()))
	for _, r := range resp.GetRecords() {
		records = append(records, recordFromProto(r))
	}
	return records, resp.GetNext(), nil
}

// CreateGroup creates the consumer group group of stream.
func (c *Client) CreateGroup(ctx context.Context, stream, group string, opts GroupOptions) (*ConsumerGroup, error) {
	svc, err := c.streamService()
	if err != nil {
		return nil, err
	}
	g, err := svc.CreateGroup(ctx, &flov1.CreateGroupRequest{
		Namespace:     c.namespace,
		Stream:        stream,
		Name:          group,
		Start:         opts.Start,
		MaxDeliveries: int32(opts.MaxDeliveries),
		Mode:          opts.Mode,
	})
	if err != nil {
		return nil, fmt.Errorf("create group %s of stream %s: %w", group, stream, err)
	}
	return groupFromProto(g), nil
}

// ListGroups returns the consumer groups of stream with their lag and pending counts.
func (c *Client) ListGroups(ctx context.Context, stream string) ([]*ConsumerGroup, error) {
	svc, err := c.streamService()
	if err != nil {
		return nil, err
	}
	return listPages(0, func(size int32, token string) ([]*flov1.ConsumerGroup, string, error) {
		resp, err := svc.ListGroups(ctx, &flov1.ListGroupsRequest{Namespace: c.namespace, Stream: stream, Limit: size, PageToken: token})
		if err != nil {
			return nil, "", fmt.Errorf("list groups of stream %s: %w", stream, err)
		}
		return resp.GetGroups(), resp.GetNextPageToken(), nil
	}, groupFromProto)
}

// DeleteGroup removes the consumer group group of stream with its pending records; the
// stream's records stay.
func (c *Client) DeleteGroup(ctx context.Context, stream, group string) error {
	svc, err := c.streamService()
	if err != nil {
		return err
	}
	if _, err := svc.DeleteGroup(ctx, &flov1.GetGroupRequest{Namespace: c.namespace, Stream: stream, Group: group}); err != nil {
		return fmt.Errorf("delete group %s of stream %s: %w", group, stream, err)
	}
	return nil
}

// ListPending returns the records group handed out and that are not acked yet, by partition
// and then offset (oldest first within a partition), and total: how many there are in all,
// not only those listed.
func (c *Client) ListPending(ctx context.Context, stream, group string, opts PendingOptions) (entries []*PendingEntry, total int64, err error) {
	svc, err := c.streamService()
	if err != nil {
		return nil, 0, err
	}
	entries, err = listPages(opts.Limit, func(size int32, token string) ([]*flov1.PendingEntry, string, error) {
		resp, err := svc.ListPending(ctx, &flov1.ListPendingRequest{
			Namespace: c.namespace,
			Stream:    stream,
			Group:     group,
			Consumer:  opts.Consumer,
			Limit:     size,
			PageToken: token,
		})
		if err != nil {
			return nil, "", fmt.Errorf("list pending records of group %s of stream %s: %w", group, stream, err)
		}
		total = resp.GetTotal()
		return resp.GetEntries(), resp.GetNextPageToken(), nil
	}, func(e *flov1.PendingEntry) *PendingEntry {
		return &PendingEntry{
			ID:            e.GetId(),
			Consumer:      e.GetConsumer(),
			DeliveryCount: int(e.GetDeliveryCount()),
			DeliveredAt:   timeFromProto(e.GetDeliveredAt()),
			RedeliverAt:   timeFromProto(e.GetRedeliverAt()),
		}
	})
	if err != nil {
		return nil, 0, err
	}
	return entries, total, nil
}

func streamFromProto(s *flov1.Stream) *Stream {
	if s == nil {
		return nil
	}
	return &Stream{
		Namespace:      s.GetNamespace(),
		Name:           s.GetName(),
		Partitions:     int(s.GetPartitions()),
		Retention:      time.Duration(s.GetRetentionMs()) * time.Millisecond,
		RetentionBytes: s.GetRetentionBytes(),
		CreatedAt:      timeFromProto(s.GetCreatedAt()),
	}
}

func groupFromProto(g *flov1.ConsumerGroup) *ConsumerGroup {
	return &ConsumerGroup{
		Namespace:     g.GetNamespace(),
		Stream:        g.GetStream(),
		Name:          g.GetName(),
		MaxDeliveries: int(g.GetMaxDeliveries()),
		Mode:          g.GetMode(),
		Lag:           g.GetLag(),
		Pending:       g.GetPending(),
		CreatedAt:     timeFromProto(g.GetCreatedAt()),
	}
}

func recordFromProto(r *flov1.StreamRecord) *Record {
	return &Record{
		ID:            r.GetId(),
		Payload:       recordPayload(r),
		Headers:       r.GetHeaders(),
		Key:           r.GetKey(),
		Partition:     int(r.GetPartition()),
		AppendedAt:    timeFromProto(r.GetAppendedAt()),
		DeliveryCount: int(r.GetDeliveryCount()),
	}
}

// recordPayload returns the record's payload bytes. The gateway fills in value, the payload
// decoded as JSON, for REST callers; a record that somehow has only the value gets it encoded
// back, so a Go caller always finds the payload in one place.
func recordPayload(r *flov1.StreamRecord) []byte {
	if len(r.GetPayload()) > 0 || r.GetValue() == nil {
		return r.GetPayload()
	}
	b, err := r.GetValue().MarshalJSON()
	if err != nil {
		return nil
	}
	return b
}
