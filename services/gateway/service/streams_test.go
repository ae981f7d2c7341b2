package service_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// num reads a JSON number the way protojson writes it: 64-bit integers as
// strings, the others as numbers.
func num(t *testing.T, v any) int64 {
	t.Helper()
	switch n := v.(type) {
	case nil:
		return 0
	case float64:
		return int64(n)
	case string:
		i, err := strconv.ParseInt(n, 10, 64)
		require.NoError(t, err)
		return i
	}
	require.Failf(t, "not a number", "%T %v", v, v)
	return 0
}

func objects(t *testing.T, v any) []map[string]any {
	t.Helper()
	if v == nil {
		return nil
	}
	list, ok := v.([]any)
	require.True(t, ok, "not a list: %v", v)
	out := make([]map[string]any, len(list))
	for i, e := range list {
		out[i] = e.(map[string]any)
	}
	return out
}

func TestStreamsOverREST(t *testing.T) {
	s := startStreamsStack(t, false)

	created := s.rest(t, http.MethodPost, "/v1/namespaces/default/streams", map[string]any{
		"name": "events", "partitions": 2, "retentionMs": 3_600_000,
	})
	require.Equal(t, http.StatusOK, created.status, "%s", created.raw)
	require.Equal(t, "events", created.body["name"])
	require.Equal(t, "default", created.body["namespace"])
	require.EqualValues(t, 2, created.body["partitions"])
	require.EqualValues(t, 3_600_000, num(t, created.body["retentionMs"]))

	one := s.rest(t, http.MethodPost, "/v1/namespaces/default/streams/events/records", map[string]any{
		"records": []any{map[string]any{
			"value": map[string]any{"type": "signup", "user": "ada <3"}, "headers": map[string]any{"source": "web"}, "key": "ada",
		}},
	})
	require.Equal(t, http.StatusOK, one.status, "%s", one.raw)
	ids := one.body["ids"].([]any)
	require.Len(t, ids, 1)
	first := ids[0].(string)
	require.Regexp(t, `^\d+-\d+$`, first)

	batch := s.rest(t, http.MethodPost, "/v1/namespaces/default/streams/events/records", map[string]any{
		"records": []any{
			map[string]any{"value": 1, "key": "k"},
			map[string]any{"payload": base64.StdEncoding.EncodeToString([]byte("not json")), "key": "k"},
			map[string]any{"value": "three", "key": "k"},
		},
	})
	require.Equal(t, http.StatusOK, batch.status, "%s", batch.raw)
	require.Len(t, batch.body["ids"], 3)

	read := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams/events/records?start=-&count=10", nil)
	require.Equal(t, http.StatusOK, read.status, "%s", read.raw)
	records := objects(t, read.body["records"])
	require.Len(t, records, 4)
	byID := map[string]map[string]any{}
	for _, r := range records {
		byID[r["id"].(string)] = r
	}
	signup := byID[first]
	require.NotNil(t, signup, "%s", read.raw)
	payload, err := base64.StdEncoding.DecodeString(signup["payload"].(string))
	require.NoError(t, err)
	require.Equal(t, `{"type":"signup","user":"ada <3"}`, string(payload), "value is stored as plain JSON")
	require.Equal(t, map[string]any{"type": "signup", "user": "ada <3"}, signup["value"])
	require.Equal(t, map[string]any{"source": "web"}, signup["headers"])
	require.Equal(t, "ada", signup["key"])
	require.NotEmpty(t, signup["appendedAt"])
	batchIDs := batch.body["ids"].([]any)
	raw := byID[batchIDs[1].(string)]
	require.Nil(t, raw["value"], "a payload that is not JSON has no value")

	tail := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams/events/records?tail=1", nil)
	require.Equal(t, http.StatusOK, tail.status, "%s", tail.raw)
	require.Len(t, tail.body["records"], 1)

	group := s.rest(t, http.MethodPost, "/v1/namespaces/default/streams/events/groups", map[string]any{
		"name": "billing", "start": "-", "maxDeliveries": 3,
	})
	require.Equal(t, http.StatusOK, group.status, "%s", group.raw)
	require.Equal(t, "billing", group.body["name"])
	require.EqualValues(t, 3, group.body["maxDeliveries"])

	got := s.rest(t, http.MethodPost, "/v1/namespaces/default/streams/events/groups/billing/read", map[string]any{
		"consumer": "c1", "count": 10, "blockMs": 1000,
	})
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	delivered := objects(t, got.body["records"])
	require.Len(t, delivered, 4)
	for _, r := range delivered {
		require.EqualValues(t, 1, r["deliveryCount"])
	}

	pending := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams/events/groups/billing/pending", nil)
	require.Equal(t, http.StatusOK, pending.status, "%s", pending.raw)
	require.EqualValues(t, 4, num(t, pending.body["total"]))
	entries := objects(t, pending.body["entries"])
	require.Len(t, entries, 4)
	require.Equal(t, "c1", entries[0]["consumer"])

	acked := s.rest(t, http.MethodPost, "/v1/namespaces/default/streams/events/groups/billing/ack", map[string]any{
		"ids": []any{delivered[0]["id"], delivered[1]["id"], delivered[2]["id"]},
	})
	require.Equal(t, http.StatusOK, acked.status, "%s", acked.raw)
	require.EqualValues(t, 3, acked.body["acked"])
	nacked := s.rest(t, http.MethodPost, "/v1/namespaces/default/streams/events/groups/billing/nack", map[string]any{
		"ids": []any{delivered[3]["id"]}, "reason": "try again",
	})
	require.Equal(t, http.StatusOK, nacked.status, "%s", nacked.raw)
	require.EqualValues(t, 1, nacked.body["nacked"])
	again := s.rest(t, http.MethodPost, "/v1/namespaces/default/streams/events/groups/billing/read", map[string]any{
		"consumer": "c2", "count": 10, "blockMs": 5000,
	})
	require.Equal(t, http.StatusOK, again.status, "%s", again.raw)
	redelivered := objects(t, again.body["records"])
	require.Len(t, redelivered, 1)
	require.Equal(t, delivered[3]["id"], redelivered[0]["id"])
	require.EqualValues(t, 2, redelivered[0]["deliveryCount"])

	info := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams/events", nil)
	require.Equal(t, http.StatusOK, info.status, "%s", info.raw)
	require.EqualValues(t, 4, num(t, info.body["length"]))
	require.NotEmpty(t, info.body["firstId"])
	require.NotEmpty(t, info.body["lastId"])
	groups := objects(t, info.body["groups"])
	require.Len(t, groups, 1)
	require.Equal(t, "billing", groups[0]["name"])
	require.EqualValues(t, 1, num(t, groups[0]["pending"]))
	require.Zero(t, num(t, groups[0]["lag"]))

	list := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams", nil)
	require.Equal(t, http.StatusOK, list.status, "%s", list.raw)
	require.Len(t, list.body["streams"], 1)
	groupList := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams/events/groups", nil)
	require.Equal(t, http.StatusOK, groupList.status, "%s", groupList.raw)
	require.Len(t, groupList.body["groups"], 1)

	delGroup := s.rest(t, http.MethodDelete, "/v1/namespaces/default/streams/events/groups/billing", nil)
	require.Equal(t, http.StatusOK, delGroup.status, "%s", delGroup.raw)
	goneGroup := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams/events/groups/billing/pending", nil)
	require.Equal(t, http.StatusNotFound, goneGroup.status, "%s", goneGroup.raw)
	delStream := s.rest(t, http.MethodDelete, "/v1/namespaces/default/streams/events", nil)
	require.Equal(t, http.StatusOK, delStream.status, "%s", delStream.raw)
	require.JSONEq(t, `{}`, string(delStream.raw))
	gone := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams/events", nil)
	require.Equal(t, http.StatusNotFound, gone.status, "%s", gone.raw)
	require.EqualValues(t, codes.NotFound, gone.body["code"])
}

func TestStreamsBadInputOverREST(t *testing.T) {
	s := startStreamsStack(t, false)
	ctx := testContext(t)
	_, err := s.streams.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: "default", Name: "events"})
	require.NoError(t, err)
	appended, err := s.streams.Append(ctx, &flov1.AppendRequest{Namespace: "default", Stream: "events", Records: []*flov1.AppendRecord{{Payload: []byte(`{}`)}}})
	require.NoError(t, err)
	_, err = s.streams.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: "default", Stream: "events", Name: "g"})
	require.NoError(t, err)
	oversized := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{'x'}, testMaxPayload+1))

	tests := []struct {
		name    string
		method  string
		path    string
		body    any
		status  int
		code    codes.Code
		message string
	}{
		{
			name: "unknown namespace", method: http.MethodGet, path: "/v1/namespaces/nope/streams",
			status: http.StatusNotFound, code: codes.NotFound, message: `namespace "nope" not found`,
		},
		{
			name: "unknown stream", method: http.MethodGet, path: "/v1/namespaces/default/streams/ghost",
			status: http.StatusNotFound, code: codes.NotFound, message: "ghost",
		},
		{
			name: "append to an unknown stream", method: http.MethodPost, path: "/v1/namespaces/default/streams/ghost/records",
			body: map[string]any{"records": []any{map[string]any{"value": 1}}}, status: http.StatusNotFound, code: codes.NotFound, message: "ghost",
		},
		{
			name: "read an unknown stream", method: http.MethodGet, path: "/v1/namespaces/default/streams/ghost/records",
			status: http.StatusNotFound, code: codes.NotFound, message: "ghost",
		},
		{
			name: "delete an unknown stream", method: http.MethodDelete, path: "/v1/namespaces/default/streams/ghost",
			status: http.StatusNotFound, code: codes.NotFound, message: "ghost",
		},
		{
			name: "group on an unknown stream", method: http.MethodPost, path: "/v1/namespaces/default/streams/ghost/groups",
			body: map[string]any{"name": "g"}, status: http.StatusNotFound, code: codes.NotFound, message: "ghost",
		},
		{
			name: "pending of an unknown group", method: http.MethodGet, path: "/v1/namespaces/default/streams/events/groups/nogroup/pending",
			status: http.StatusNotFound, code: codes.NotFound, message: "nogroup",
		},
		{
			name: "read of an unknown group", method: http.MethodPost, path: "/v1/namespaces/default/streams/events/groups/nogroup/read",
			body: map[string]any{"consumer": "c"}, status: http.StatusNotFound, code: codes.NotFound, message: "nogroup",
		},
		{
			name: "malformed start id", method: http.MethodGet, path: "/v1/namespaces/default/streams/events/records?start=abc",
			status: http.StatusBadRequest, code: codes.InvalidArgument, message: `invalid record id "abc"`,
		},
		{
			name: "malformed end id", method: http.MethodGet, path: "/v1/namespaces/default/streams/events/records?end=12-x",
			status: http.StatusBadRequest, code: codes.InvalidArgument, message: `invalid record id "12-x"`,
		},
		{
			name: "malformed id in an ack", method: http.MethodPost, path: "/v1/namespaces/default/streams/events/groups/g/ack",
			body: map[string]any{"ids": []any{"nope"}}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: `invalid record id "nope"`,
		},
		{
			name: "malformed group start", method: http.MethodPost, path: "/v1/namespaces/default/streams/events/groups",
			body: map[string]any{"name": "late", "start": "banana"}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "banana",
		},
		{
			name: "oversized record", method: http.MethodPost, path: "/v1/namespaces/default/streams/events/records",
			body:   map[string]any{"records": []any{map[string]any{"value": 1}, map[string]any{"payload": oversized}}},
			status: http.StatusBadRequest, code: codes.InvalidArgument, message: "records[1]: payload is 4097 bytes, limit is 4096",
		},
		{
			name: "oversized value", method: http.MethodPost, path: "/v1/namespaces/default/streams/events/records",
			body:   map[string]any{"records": []any{map[string]any{"value": strings.Repeat("v", testMaxPayload)}}},
			status: http.StatusBadRequest, code: codes.InvalidArgument, message: "records[0]: payload is 4098 bytes",
		},
		{
			name: "no records", method: http.MethodPost, path: "/v1/namespaces/default/streams/events/records",
			body: map[string]any{"records": []any{}}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "at least one record",
		},
		{
			name: "retention too short", method: http.MethodPost, path: "/v1/namespaces/default/streams",
			body: map[string]any{"name": "short", "retentionMs": 5}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "retention",
		},
		{
			name: "negative retention", method: http.MethodPost, path: "/v1/namespaces/default/streams",
			body: map[string]any{"name": "negative", "retentionMs": -1}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "retention",
		},
		{
			name: "retention bytes too small", method: http.MethodPost, path: "/v1/namespaces/default/streams",
			body: map[string]any{"name": "tiny", "retentionBytes": 10}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "retention",
		},
		{
			name: "too many partitions", method: http.MethodPost, path: "/v1/namespaces/default/streams",
			body: map[string]any{"name": "wide", "partitions": 300}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "partitions",
		},
		{
			name: "invalid stream name", method: http.MethodPost, path: "/v1/namespaces/default/streams",
			body: map[string]any{"name": ".hidden"}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: `name ".hidden" is invalid`,
		},
		{
			name: "stream exists", method: http.MethodPost, path: "/v1/namespaces/default/streams",
			body: map[string]any{"name": "events"}, status: http.StatusConflict, code: codes.AlreadyExists, message: "events",
		},
		{
			name: "unknown field", method: http.MethodPost, path: "/v1/namespaces/default/streams",
			body: `{"nmae": "x"}`, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "nmae",
		},
		{
			name: "malformed JSON", method: http.MethodPost, path: "/v1/namespaces/default/streams/events/records",
			body: `{"records": [`, status: http.StatusBadRequest, code: codes.InvalidArgument,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := s.rest(t, tc.method, tc.path, tc.body)
			require.Equal(t, tc.status, resp.status, "%s", resp.raw)
			require.NotNil(t, resp.body, "the error body is JSON: %s", resp.raw)
			require.EqualValues(t, tc.code, resp.body["code"], "%s", resp.raw)
			msg, _ := resp.body["message"].(string)
			require.NotEmpty(t, msg)
			require.Contains(t, msg, tc.message)
		})
	}

	// Nothing changed: one stream with its one record and one group.
	list, err := s.streams.ListStreams(ctx, &flov1.ListStreamsRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Len(t, list.GetStreams(), 1)
	info, err := s.streams.GetStream(ctx, &flov1.GetStreamRequest{Namespace: "default", Stream: "events"})
	require.NoError(t, err)
	require.EqualValues(t, 1, info.GetLength())
	require.Equal(t, appended.GetIds()[0], info.GetLastId())
	require.Len(t, info.GetGroups(), 1)
}

func TestStreamsBadInputOverGRPC(t *testing.T) {
	s := startStreamsStack(t, false)
	ctx := testContext(t)
	_, err := s.streams.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: "default", Name: "events"})
	require.NoError(t, err)
	_, err = s.streams.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: "default", Stream: "events", Name: "g"})
	require.NoError(t, err)
	many := make([]*flov1.AppendRecord, 10_001)
	for i := range many {
		many[i] = &flov1.AppendRecord{Payload: []byte("1")}
	}

	tests := []struct {
		name    string
		call    func() error
		code    codes.Code
		message string
	}{
		{"empty namespace", func() error {
			_, err := s.streams.ListStreams(ctx, &flov1.ListStreamsRequest{})
			return err
		}, codes.InvalidArgument, "namespace is required"},
		{"unknown namespace", func() error {
			_, err := s.streams.GetStream(ctx, &flov1.GetStreamRequest{Namespace: "nope", Stream: "events"})
			return err
		}, codes.NotFound, `namespace "nope" not found`},
		{"unknown stream", func() error {
			_, err := s.streams.Read(ctx, &flov1.ReadRequest{Namespace: "default", Stream: "ghost"})
			return err
		}, codes.NotFound, "ghost"},
		{"unknown group", func() error {
			_, err := s.streams.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: "default", Stream: "events", Group: "nogroup", Consumer: "c"})
			return err
		}, codes.NotFound, "nogroup"},
		{"empty stream name", func() error {
			_, err := s.streams.GetStream(ctx, &flov1.GetStreamRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument, "stream is required"},
		{"malformed id", func() error {
			_, err := s.streams.Read(ctx, &flov1.ReadRequest{Namespace: "default", Stream: "events", Start: "(x-1"})
			return err
		}, codes.InvalidArgument, "invalid record id"},
		{"oversized record", func() error {
			_, err := s.streams.Append(ctx, &flov1.AppendRequest{Namespace: "default", Stream: "events", Records: []*flov1.AppendRecord{
				{Payload: make([]byte, testMaxPayload+1)},
			}})
			return err
		}, codes.InvalidArgument, "records[0]: payload is 4097 bytes, limit is 4096"},
		{"oversized value", func() error {
			_, err := s.streams.Append(ctx, &flov1.AppendRequest{Namespace: "default", Stream: "events", Records: []*flov1.AppendRecord{
				{Payload: []byte("1")}, {Value: structpb.NewStringValue(strings.Repeat("v", testMaxPayload))},
			}})
			return err
		}, codes.InvalidArgument, "records[1]"},
		{"too many records", func() error {
			_, err := s.streams.Append(ctx, &flov1.AppendRequest{Namespace: "default", Stream: "events", Records: many})
			return err
		}, codes.InvalidArgument, "limit is 10000"},
		{"invalid retention", func() error {
			_, err := s.streams.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: "default", Name: "r", RetentionMs: 59_999})
			return err
		}, codes.InvalidArgument, "retention"},
		{"invalid consumer", func() error {
			_, err := s.streams.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: "default", Stream: "events", Group: "g", Consumer: "a/b"})
			return err
		}, codes.InvalidArgument, "consumer"},
		{"negative count", func() error {
			_, err := s.streams.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: "default", Stream: "events", Group: "g", Consumer: "c", Count: -1})
			return err
		}, codes.InvalidArgument, "count"},
		{"group exists", func() error {
			_, err := s.streams.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: "default", Stream: "events", Name: "g"})
			return err
		}, codes.AlreadyExists, "g"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.Equal(t, tc.code, status.Code(err), "error: %v", err)
			require.Contains(t, status.Convert(err).Message(), tc.message)
		})
	}
	info, err := s.streams.GetStream(ctx, &flov1.GetStreamRequest{Namespace: "default", Stream: "events"})
	require.NoError(t, err)
	require.Zero(t, info.GetLength(), "no refused append wrote anything")
}

// TestStreamsNotConfigured runs a gateway without a streams service: stream
// calls and stream workers are refused with Unavailable, the rest works.
func TestStreamsNotConfigured(t *testing.T) {
	s := startStack(t)
	resp := s.rest(t, http.MethodGet, "/v1/namespaces/default/streams", nil)
	require.Equal(t, http.StatusServiceUnavailable, resp.status, "%s", resp.raw)
	require.EqualValues(t, codes.Unavailable, resp.body["code"])
	require.Contains(t, resp.body["message"], "streams service not configured")

	_, err := s.streams.Append(testContext(t), &flov1.AppendRequest{Namespace: "default", Stream: "events", Records: []*flov1.AppendRecord{{Payload: []byte("1")}}})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	stream, err := s.workers.Stream(testContext(t))
	require.NoError(t, err)
	require.NoError(t, stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{
		Token: adminToken, Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}},
	}}}))
	_, err = stream.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "streams service not configured")
}

// Raw stream-worker helpers.

func (w *rawWorker) streamRead(t *testing.T, stream, group string, count int32, blockMS int64) {
	t.Helper()
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamRead{StreamRead: &flov1.StreamRead{
		Stream: stream, Group: group, Count: count, BlockMs: blockMS,
	}}})
}

func (w *rawWorker) ack(t *testing.T, stream, group string, ids ...string) {
	t.Helper()
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamAck{StreamAck: &flov1.StreamAck{Stream: stream, Group: group, Ids: ids}}})
}

func (w *rawWorker) nack(t *testing.T, stream, group, reason string, ids ...string) {
	t.Helper()
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamNack{StreamNack: &flov1.StreamNack{Stream: stream, Group: group, Ids: ids, Reason: reason}}})
}

// sync returns once the gateway has handled every message sent before: it
// sends a Touch of an unknown task and waits for its TouchAck, and the
// gateway handles a stream's messages in order.
func (w *rawWorker) sync(t *testing.T) {
	t.Helper()
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Touch{Touch: &flov1.Touch{
		TaskId: "0195c1a0-0000-7000-8000-000000000000", Attempt: 1, ExtendMs: 1000,
	}}})
	m := w.next(t)
	require.NotNil(t, m.GetTouchAck(), "expected a TouchAck, got %v", m)
	require.False(t, m.GetTouchAck().GetOk())
}

// recordBatch returns the next server message, which must be a RecordBatch.
func (w *rawWorker) recordBatch(t *testing.T) *flov1.RecordBatch {
	t.Helper()
	m := w.next(t)
	b := m.GetRecordBatch()
	require.NotNil(t, b, "expected a RecordBatch, got %v", m)
	return b
}

// ended reads until the stream ends and returns how it ended; it fails on
// any record that arrives meanwhile.
func (w *rawWorker) ended(t *testing.T) error {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				return <-w.done
			}
			require.Empty(t, m.GetRecordBatch().GetRecords(), "records arrived: %v", m)
		case <-timeout:
			require.FailNow(t, "the stream did not end")
		}
	}
}

func recordIDs(records []*flov1.StreamRecord) []string {
	ids := make([]string, len(records))
	for i, r := range records {
		ids[i] = r.GetId()
	}
	return ids
}

// appendN appends n JSON records {"n": i} and returns their ids.
func appendN(t *testing.T, s *stack, stream string, n int) []string {
	t.Helper()
	records := make([]*flov1.AppendRecord, n)
	for i := range records {
		records[i] = &flov1.AppendRecord{Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	resp, err := s.streams.Append(testContext(t), &flov1.AppendRequest{Namespace: "default", Stream: stream, Records: records})
	require.NoError(t, err)
	return resp.GetIds()
}

func createStreamAndGroup(t *testing.T, s *stack, stream, group string) {
	t.Helper()
	ctx := testContext(t)
	_, err := s.streams.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: "default", Name: stream})
	require.NoError(t, err)
	_, err = s.streams.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: "default", Stream: stream, Name: group, Start: "-"})
	require.NoError(t, err)
}

// pendingTotal returns how many records of the group are pending.
func pendingTotal(t *testing.T, s *stack, stream, group string) int64 {
	t.Helper()
	resp, err := s.streams.ListPending(testContext(t), &flov1.ListPendingRequest{Namespace: "default", Stream: stream, Group: group})
	require.NoError(t, err)
	return resp.GetTotal()
}

// TestStreamWorkerSession drives a stream worker by hand: a Hello with a
// stream and no actions, reads answered by one RecordBatch each, coalesced
// acks, a nack that brings a record back, and an empty batch when the block
// time passes.
func TestStreamWorkerSession(t *testing.T) {
	s := startStreamsStack(t, false)
	createStreamAndGroup(t, s, "events", "default")
	ids := appendN(t, s, "events", 5)

	// Group and consumer left out: "default" and the worker id.
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "sw1", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
	w.streamRead(t, "events", "", 3, 20_000)
	b := w.recordBatch(t)
	require.Equal(t, "events", b.GetStream())
	require.Equal(t, "default", b.GetGroup())
	require.Len(t, b.GetRecords(), 3)
	for _, r := range b.GetRecords() {
		require.Contains(t, ids, r.GetId())
		require.EqualValues(t, 1, r.GetDeliveryCount())
		require.Regexp(t, `^\{"n":\d\}$`, string(r.GetPayload()))
		require.Nil(t, r.GetValue(), "workers read payload bytes")
	}
	first := recordIDs(b.GetRecords())

	pending, err := s.streams.ListPending(testContext(t), &flov1.ListPendingRequest{Namespace: "default", Stream: "events", Group: "default"})
	require.NoError(t, err)
	require.EqualValues(t, 3, pending.GetTotal())
	for _, e := range pending.GetEntries() {
		require.Equal(t, "sw1", e.GetConsumer(), "the consumer defaults to the worker id")
	}

	// Acks in two messages are recorded (coalesced or not).
	w.ack(t, "events", "default", first[0])
	w.ack(t, "events", "", first[1:]...)
	require.Eventually(t, func() bool { return pendingTotal(t, s, "events", "default") == 0 }, wait, 10*time.Millisecond)

	w.streamRead(t, "events", "default", 10, 20_000)
	rest := w.recordBatch(t).GetRecords()
	require.Len(t, rest, 2)
	require.ElementsMatch(t, ids, append(first, recordIDs(rest)...))

	w.ack(t, "events", "default", rest[0].GetId())
	w.nack(t, "events", "default", "handler failed", rest[1].GetId())
	w.streamRead(t, "events", "default", 10, 20_000)
	again := w.recordBatch(t).GetRecords()
	require.Len(t, again, 1)
	require.Equal(t, rest[1].GetId(), again[0].GetId())
	require.EqualValues(t, 2, again[0].GetDeliveryCount())
	w.ack(t, "events", "default", again[0].GetId())

	w.streamRead(t, "events", "default", 10, 50)
	require.Empty(t, w.recordBatch(t).GetRecords(), "nothing to read: an empty batch after the block time")
	require.Eventually(t, func() bool { return pendingTotal(t, s, "events", "default") == 0 }, wait, 10*time.Millisecond)

	t.Run("a worker may consume streams and run actions on one stream", func(t *testing.T) {
		both := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "both", Namespace: "default", Actions: []string{"job"},
			Streams: []*flov1.StreamSubscription{{Stream: "events", Group: "default", Consumer: "both-c"}}})
		id := invoke(t, s, "job", `{}`)
		both.ready(t, 1, 20_000)
		task := both.tasks(t, 1)[0]
		require.Equal(t, id, task.GetTaskId())
		recID := appendN(t, s, "events", 1)[0]
		both.streamRead(t, "events", "default", 1, 20_000)
		got := both.recordBatch(t).GetRecords()
		require.Len(t, got, 1)
		require.Equal(t, recID, got[0].GetId())
		both.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(id, task.GetAttempt(), `"ok"`)}})
		both.ack(t, "events", "default", recID)
		awaitStatus(t, s, id, flov1.TaskStatus_TASK_STATUS_COMPLETED)
		require.Eventually(t, func() bool { return pendingTotal(t, s, "events", "default") == 0 }, wait, 10*time.Millisecond)
	})
}

// TestStreamWorkerProtocolErrors checks what ends a stream worker's stream,
// and with which code.
func TestStreamWorkerProtocolErrors(t *testing.T) {
	s := startStreamsStack(t, false)
	createStreamAndGroup(t, s, "events", "default")
	hello := func(id string) *flov1.Hello {
		return &flov1.Hello{Token: adminToken, WorkerId: id, Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}}
	}

	t.Run("a fifth outstanding read", func(t *testing.T) {
		w := openWorker(t, s, hello("twice"))
		for range 5 {
			w.streamRead(t, "events", "default", 1, 60_000)
		}
		err := w.ended(t)
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "already outstanding")
	})
	t.Run("a read of a stream the Hello did not name", func(t *testing.T) {
		w := openWorker(t, s, hello("other"))
		w.streamRead(t, "orders", "default", 1, 1000)
		err := w.ended(t)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "orders/default")
	})
	t.Run("a read of an unknown group ends with NotFound", func(t *testing.T) {
		w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "lost", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events", Group: "nogroup"}}})
		w.streamRead(t, "events", "nogroup", 1, 1000)
		err := w.ended(t)
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	})
	t.Run("a malformed id in an ack", func(t *testing.T) {
		w := openWorker(t, s, hello("sloppy"))
		w.ack(t, "events", "default", "12-x")
		err := w.ended(t)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), `invalid record id "12-x"`)
	})
	refusals := []struct {
		name  string
		hello *flov1.Hello
		text  string
	}{
		{"invalid stream name", &flov1.Hello{Token: adminToken, Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "-x"}}}, "streams[0]"},
		{"missing stream name", &flov1.Hello{Token: adminToken, Namespace: "default", Streams: []*flov1.StreamSubscription{{Group: "g"}}}, "stream is required"},
		{"invalid consumer", &flov1.Hello{Token: adminToken, Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events", Consumer: "a b"}}}, "consumer"},
		{"one stream/group as two consumers", &flov1.Hello{Token: adminToken, Namespace: "default", Streams: []*flov1.StreamSubscription{
			{Stream: "events", Consumer: "c1"}, {Stream: "events", Group: "default", Consumer: "c2"},
		}}, "twice"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := s.workers.Stream(testContext(t))
			require.NoError(t, err)
			require.NoError(t, stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: tc.hello}}))
			_, err = stream.Recv()
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.text)
		})
	}
}

// groupLag returns how many records of the group no consumer has been handed.
func groupLag(t *testing.T, s *stack, stream, group string) int64 {
	t.Helper()
	resp, err := s.streams.ListGroups(testContext(t), &flov1.ListGroupsRequest{Namespace: "default", Stream: stream})
	require.NoError(t, err)
	for _, g := range resp.GetGroups() {
		if g.GetName() == group {
			return g.GetLag()
		}
	}
	require.FailNow(t, "no such group", group)
	return 0
}

// TestStreamWorkerDrain drains a stream worker whose read is outstanding:
// it gets Drain and an empty answer, its later reads are answered empty,
// a record the outstanding group read picks up afterwards is nacked at once
// (another consumer gets it long before the message timeout), and its acks
// still go through.
func TestStreamWorkerDrain(t *testing.T) {
	s := startStreamsStack(t, true)
	createStreamAndGroup(t, s, "events", "default")
	held := appendN(t, s, "events", 1)[0]

	reg := s.rest(t, http.MethodPost, "/v1/namespaces/default/workers", map[string]any{
		"workerId": "sw-drain", "workerType": "WORKER_TYPE_STREAM", "processes": []any{map[string]any{"name": "events/default"}},
	})
	require.Equal(t, http.StatusOK, reg.status, "%s", reg.raw)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "sw-drain", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
	w.streamRead(t, "events", "default", 1, 20_000)
	got := w.recordBatch(t).GetRecords()
	require.Len(t, got, 1)
	require.Equal(t, held, got[0].GetId())

	// Outstanding with nothing to read; the group read waits up to a minute,
	// and whatever it gets must not be stranded for the 10 minute timeout.
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamRead{StreamRead: &flov1.StreamRead{
		Stream: "events", Count: 10, BlockMs: 60_000, MessageTimeoutMs: 600_000,
	}}})
	w.sync(t)
	drain := s.rest(t, http.MethodPost, "/v1/namespaces/default/workers/sw-drain/drain", nil)
	require.Equal(t, http.StatusOK, drain.status, "%s", drain.raw)
	sawDrain, sawAnswer := false, false
	for !sawDrain || !sawAnswer {
		m := w.next(t)
		switch {
		case m.GetDrain() != nil:
			sawDrain = true
		case m.GetRecordBatch() != nil:
			require.Empty(t, m.GetRecordBatch().GetRecords())
			sawAnswer = true
		default:
			require.Failf(t, "unexpected message", "%v", m)
		}
	}

	// The outstanding group read is still waiting on the streams service;
	// a record appended now goes to it, and it hands the record back.
	late := appendN(t, s, "events", 1)[0]
	require.Eventually(t, func() bool { return groupLag(t, s, "events", "default") == 0 }, wait, 10*time.Millisecond,
		"the drained session's group read never picked the record up")

	w.streamRead(t, "events", "default", 10, 60_000)
	require.Empty(t, w.recordBatch(t).GetRecords(), "a draining worker's read is answered empty at once")

	// The drained worker finishes what it held.
	w.ack(t, "events", "default", held)

	other := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "sw-other", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
	other.streamRead(t, "events", "default", 10, 20_000)
	rec := other.recordBatch(t).GetRecords()
	require.Len(t, rec, 1)
	require.Equal(t, late, rec[0].GetId())
	other.ack(t, "events", "default", late)
	require.Eventually(t, func() bool { return pendingTotal(t, s, "events", "default") == 0 }, wait, 10*time.Millisecond)
	require.Empty(t, w.msgs, "nothing more reached the drained worker")
}

// TestStreamWorkerDisconnect ends a stream worker's stream right after it
// acked and while a read of it is outstanding: the acks are recorded, and
// a record appended afterwards goes to the next consumer as its first
// delivery. The read leaves its hub with the stream; when it is already
// waiting in a round on the streams service, the round goes on and what it
// brings for the gone worker is released without counting the delivery no
// one saw.
func TestStreamWorkerDisconnect(t *testing.T) {
	for _, inRound := range []bool{false, true} {
		t.Run(fmt.Sprintf("read in a round=%v", inRound), func(t *testing.T) {
			s := startStreamsStack(t, false)
			createStreamAndGroup(t, s, "events", "default")
			ids := appendN(t, s, "events", 3)

			w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "gone", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
			w.streamRead(t, "events", "default", 10, 20_000)
			got := w.recordBatch(t).GetRecords()
			require.Len(t, got, 3)
			w.ack(t, "events", "default", recordIDs(got)...)
			w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_StreamRead{StreamRead: &flov1.StreamRead{
				Stream: "events", Count: 10, BlockMs: 60_000, MessageTimeoutMs: 600_000,
			}}})
			if inRound {
				require.Eventually(t, func() bool {
					many, _ := streamsReadHandlers()
					return many == 1
				}, wait, 10*time.Millisecond, "the read never waited at the streams service")
			}
			require.NoError(t, w.stream.CloseSend())
			require.ErrorIs(t, w.ended(t), io.EOF, "the worker closed its side; the stream ends cleanly")
			require.Eventually(t, func() bool { return pendingTotal(t, s, "events", "default") == 0 }, wait, 10*time.Millisecond,
				"acks sent before the disconnect were not recorded")
			require.ElementsMatch(t, ids, recordIDs(got))

			late := appendN(t, s, "events", 1)[0]
			next := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "next", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
			next.streamRead(t, "events", "default", 10, 20_000)
			rec := next.recordBatch(t).GetRecords()
			require.Len(t, rec, 1)
			require.Equal(t, late, rec[0].GetId())
			require.EqualValues(t, 1, rec[0].GetDeliveryCount(), "the gone worker's read took the record first")
		})
	}
}

// TestShutdownAnswersOutstandingReads stops the gateway while a stream
// worker's read is outstanding: the read is answered empty and the stream
// ends with Unavailable, so the worker reconnects elsewhere.
func TestShutdownAnswersOutstandingReads(t *testing.T) {
	s := startStreamsStack(t, false)
	createStreamAndGroup(t, s, "events", "default")
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "sw", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
	w.streamRead(t, "events", "default", 10, 60_000)
	w.sync(t)

	stopped := make(chan error, 1)
	go func() { stopped <- s.stopGateway() }()
	require.Empty(t, w.recordBatch(t).GetRecords())
	require.Equal(t, codes.Unavailable, status.Code(w.ended(t)))
	require.NoError(t, <-stopped)
}

// TestStreamWorkerPipelinedReads keeps two reads of one stream/group
// outstanding: each is answered by its own RecordBatch, and a stopping
// gateway answers every outstanding read.
func TestStreamWorkerPipelinedReads(t *testing.T) {
	s := startStreamsStack(t, false)
	createStreamAndGroup(t, s, "events", "default")
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "sw", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
	w.streamRead(t, "events", "default", 2, 60_000)
	w.streamRead(t, "events", "default", 2, 60_000)
	w.sync(t)

	ids := appendN(t, s, "events", 3)
	var got []string
	for range 2 {
		recs := w.recordBatch(t).GetRecords()
		require.NotEmpty(t, recs, "each read gets records: there are more than one read takes")
		got = append(got, recordIDs(recs)...)
	}
	require.ElementsMatch(t, ids, got)
	w.ack(t, "events", "default", got...)
	require.Eventually(t, func() bool { return pendingTotal(t, s, "events", "default") == 0 }, wait, 10*time.Millisecond)

	w.streamRead(t, "events", "default", 2, 60_000)
	w.streamRead(t, "events", "default", 2, 60_000)
	w.sync(t)
	stopped := make(chan error, 1)
	go func() { stopped <- s.stopGateway() }()
	require.Empty(t, w.recordBatch(t).GetRecords())
	require.Empty(t, w.recordBatch(t).GetRecords())
	require.Equal(t, codes.Unavailable, status.Code(w.ended(t)))
	require.NoError(t, <-stopped)
}

// TestAppendCarriesTheCallersTrace appends over gRPC and REST with a W3C
// trace context: each record comes back, by range read and on the worker
// stream, with the caller's trace id in trace_context, so a stream worker's
// span continues the appender's trace.
func TestAppendCarriesTheCallersTrace(t *testing.T) {
	s := startStreamsStack(t, false)
	createStreamAndGroup(t, s, "events", "default")
	const grpcTrace, restTrace = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"

	ctx := metadata.AppendToOutgoingContext(testContext(t), "traceparent", "00-"+grpcTrace+"-00f067aa0ba902b7-01")
	viaGRPC, err := s.streams.Append(ctx, &flov1.AppendRequest{Namespace: "default", Stream: "events", Records: []*flov1.AppendRecord{{Payload: []byte(`"grpc"`)}}})
	require.NoError(t, err)

	req, err := http.NewRequestWithContext(testContext(t), http.MethodPost, s.base+"/v1/namespaces/default/streams/events/records",
		strings.NewReader(`{"records":[{"value":"rest"}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("traceparent", "00-"+restTrace+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	read, err := s.streams.Read(testContext(t), &flov1.ReadRequest{Namespace: "default", Stream: "events"})
	require.NoError(t, err)
	require.Len(t, read.GetRecords(), 2)
	require.Equal(t, viaGRPC.GetIds()[0], read.GetRecords()[0].GetId())
	require.Contains(t, read.GetRecords()[0].GetTraceContext()["traceparent"], grpcTrace)
	require.Contains(t, read.GetRecords()[1].GetTraceContext()["traceparent"], restTrace)
	require.NotContains(t, read.GetRecords()[0].GetHeaders(), "traceparent", "the trace context is not a user header")

	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "traced", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
	w.streamRead(t, "events", "default", 10, 20_000)
	got := w.recordBatch(t).GetRecords()
	require.Len(t, got, 2)
	traces := []string{got[0].GetTraceContext()["traceparent"], got[1].GetTraceContext()["traceparent"]}
	require.Contains(t, strings.Join(traces, " "), grpcTrace)
	require.Contains(t, strings.Join(traces, " "), restTrace)
}

// TestStreamWorkerSurvivesStreamsRestart stops the streams service under a
// stream worker's outstanding read: the worker's stream stays open, its
// reads are retried (or answered empty, and asked again), and once a new
// streams service serves the same database the worker gets the record
// appended then and acks it.
func TestStreamWorkerSurvivesStreamsRestart(t *testing.T) {
	s := startStreamsStack(t, false)
	createStreamAndGroup(t, s, "events", "default")
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "steady", Namespace: "default", Streams: []*flov1.StreamSubscription{{Stream: "events"}}})
	w.streamRead(t, "events", "default", 10, 60_000)
	w.sync(t)

	require.NoError(t, s.stopStreams())
	s.startStreams(t)
	var id string
	require.Eventually(t, func() bool {
		resp, err := s.streams.Append(testContext(t), &flov1.AppendRequest{Namespace: "default", Stream: "events", Records: []*flov1.AppendRecord{{Payload: []byte(`{}`)}}})
		if err != nil {
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			return false
		}
		id = resp.GetIds()[0]
		return true
	}, wait, 50*time.Millisecond)

	for {
		b := w.recordBatch(t)
		if len(b.GetRecords()) == 0 {
			// The stopping service answered the blocked read empty.
			w.streamRead(t, "events", "default", 10, 60_000)
			continue
		}
		require.Len(t, b.GetRecords(), 1)
		require.Equal(t, id, b.GetRecords()[0].GetId())
		break
	}
	w.ack(t, "events", "default", id)
	require.Eventually(t, func() bool { return pendingTotal(t, s, "events", "default") == 0 }, wait, 10*time.Millisecond)
}
