package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// recordingStreams answers the stream calls the CLI makes with fixed data and keeps the
// requests, so a test can check what the flags turned into on the wire.
type recordingStreams struct {
	flov1.UnimplementedStreamServiceServer
	mu       sync.Mutex
	requests []proto.Message
	// reads answers Read calls in turn; past its end a read waits for its context to end, as a
	// blocking read with nothing new would, until ctrl-C.
	reads    []*flov1.ReadResponse
	readDone chan struct{}
}

func (r *recordingStreams) keep(req proto.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, req)
}

func (r *recordingStreams) sent() []proto.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]proto.Message(nil), r.requests...)
}

var appendedAt = timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))

func (r *recordingStreams) CreateStream(_ context.Context, req *flov1.CreateStreamRequest) (*flov1.Stream, error) {
	r.keep(req)
	return &flov1.Stream{Namespace: req.GetNamespace(), Name: req.GetName(), Partitions: max(req.GetPartitions(), 1),
		RetentionMs: req.GetRetentionMs(), RetentionBytes: req.GetRetentionBytes()}, nil
}

func (r *recordingStreams) GetStream(_ context.Context, req *flov1.GetStreamRequest) (*flov1.StreamInfo, error) {
	r.keep(req)
	if req.GetStream() != "events" {
		return nil, status.Errorf(codes.NotFound, "stream %q not found in namespace %q", req.GetStream(), req.GetNamespace())
	}
	return &flov1.StreamInfo{
		Stream: &flov1.Stream{Namespace: req.GetNamespace(), Name: "events", Partitions: 2},
		Length: 3, FirstId: "1767323045000-0", LastId: "1767323045002-2000",
		Groups: []*flov1.ConsumerGroup{{Namespace: req.GetNamespace(), Stream: "events", Name: "processors", MaxDeliveries: 5, Lag: 1, Pending: 1}},
	}, nil
}

func (r *recordingStreams) ListStreams(_ context.Context, req *flov1.ListStreamsRequest) (*flov1.ListStreamsResponse, error) {
	r.keep(req)
	return &flov1.ListStreamsResponse{Streams: []*flov1.Stream{{Namespace: req.GetNamespace(), Name: "events", Partitions: 2}}}, nil
}

func (r *recordingStreams) DeleteStream(_ context.Context, req *flov1.GetStreamRequest) (*flov1.DeleteStreamResponse, error) {
	r.keep(req)
	return &flov1.DeleteStreamResponse{}, nil
}

func (r *recordingStreams) Append(_ context.Context, req *flov1.AppendRequest) (*flov1.AppendResponse, error) {
	r.keep(req)
	ids := make([]string, len(req.GetRecords()))
	for i := range ids {
		ids[i] = fmt.Sprintf("1767323045000-%d", len(r.sent())*100_000+i*1000)
	}
	return &flov1.AppendResponse{Ids: ids}, nil
}

func (r *recordingStreams) Read(ctx context.Context, req *flov1.ReadRequest) (*flov1.ReadResponse, error) {
	r.keep(req)
	r.mu.Lock()
	if len(r.reads) == 0 {
		r.mu.Unlock()
		if r.readDone != nil {
			close(r.readDone)
		}
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	resp := r.reads[0]
	r.reads = r.reads[1:]
	r.mu.Unlock()
	return resp, nil
}

func (r *recordingStreams) CreateGroup(_ context.Context, req *flov1.CreateGroupRequest) (*flov1.ConsumerGroup, error) {
	r.keep(req)
	return &flov1.ConsumerGroup{Namespace: req.GetNamespace(), Stream: req.GetStream(), Name: req.GetName(), MaxDeliveries: max(req.GetMaxDeliveries(), 5), Mode: cmp.Or(req.GetMode(), "shared")}, nil
}

func (r *recordingStreams) ListGroups(_ context.Context, req *flov1.ListGroupsRequest) (*flov1.ListGroupsResponse, error) {
	r.keep(req)
	return &flov1.ListGroupsResponse{Groups: []*flov1.ConsumerGroup{{Namespace: req.GetNamespace(), Stream: req.GetStream(), Name: "processors", MaxDeliveries: 5, Mode: "shared", Lag: 4}}}, nil
}

func (r *recordingStreams) DeleteGroup(_ context.Context, req *flov1.GetGroupRequest) (*flov1.DeleteGroupResponse, error) {
	r.keep(req)
	return &flov1.DeleteGroupResponse{}, nil
}

func (r *recordingStreams) ListPending(_ context.Context, req *flov1.ListPendingRequest) (*flov1.ListPendingResponse, error) {
	r.keep(req)
	return &flov1.ListPendingResponse{Total: 12, Entries: []*flov1.PendingEntry{{
		Id: "1767323045000-0", Consumer: "w-1", DeliveryCount: 2, DeliveredAt: appendedAt,
	}}}, nil
}

func serveStreams(t *testing.T, r *recordingStreams) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	flov1.RegisterStreamServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func requireSent(t *testing.T, want, got proto.Message) {
	t.Helper()
	require.True(t, proto.Equal(want, got), "want %v\ngot  %v", want, got)
}

func TestStreamArgumentValidation(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		stdin   string
		wantErr string
	}{
		{name: "create without name", args: []string{"stream", "create"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "negative partitions", args: []string{"stream", "create", "events", "--partitions", "-1"}, wantErr: "must not be negative"},
		{name: "negative retention", args: []string{"stream", "create", "events", "--retention", "-1h"}, wantErr: "must not be negative"},
		{name: "bad retention", args: []string{"stream", "create", "events", "--retention", "a day"}, wantErr: `invalid argument "a day" for "--retention"`},
		{name: "negative retention bytes", args: []string{"stream", "create", "events", "--retention-bytes", "-5"}, wantErr: "must not be negative"},
		{name: "append without record", args: []string{"stream", "append", "events"}, wantErr: "give the record as a JSON argument, - for JSON lines on standard input, or --file"},
		{name: "append invalid JSON", args: []string{"stream", "append", "events", "{type: signup}"}, wantErr: "invalid JSON payload: invalid character 't'"},
		{name: "append record and file", args: []string{"stream", "append", "events", "{}", "--file", "x.jsonl"}, wantErr: "not both"},
		{name: "append bad header", args: []string{"stream", "append", "events", "{}", "--header", "source"}, wantErr: `--header "source": want key=value`},
		{name: "append empty header key", args: []string{"stream", "append", "events", "{}", "--header", "=web"}, wantErr: `--header "=web": want key=value`},
		{name: "append bad line", args: []string{"stream", "append", "events", "-"}, stdin: "{\"a\":1}\n\n{\"b\":\n", wantErr: "line 3: invalid JSON: unexpected end of JSON input"},
		{name: "append no lines", args: []string{"stream", "append", "events", "-"}, stdin: "\n  \n", wantErr: "no records to append"},
		{name: "append missing file", args: []string{"stream", "append", "events", "--file", "/nonexistent/records.jsonl"}, wantErr: "read records: open /nonexistent/records.jsonl"},
		{name: "append too many arguments", args: []string{"stream", "append", "events", "{}", "{}"}, wantErr: "accepts between 1 and 2 arg(s), received 3"},
		{name: "read without name", args: []string{"stream", "read"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "read negative count", args: []string{"stream", "read", "events", "--count", "-1"}, wantErr: "must not be negative"},
		{name: "read tail and start", args: []string{"stream", "read", "events", "--tail", "5", "--start", "-"}, wantErr: "--tail reads the last records; it cannot be combined with --start or --end"},
		{name: "read follow with end", args: []string{"stream", "read", "events", "--follow", "--end", "1-0"}, wantErr: "cannot be combined with --end"},
		{name: "info without name", args: []string{"stream", "info"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "list with argument", args: []string{"stream", "list", "events"}, wantErr: `unknown command "events" for "flo stream list"`},
		{name: "delete without name", args: []string{"stream", "delete"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "group create without group", args: []string{"stream", "group", "create", "events"}, wantErr: "accepts 2 arg(s), received 1"},
		{name: "group create negative deliveries", args: []string{"stream", "group", "create", "events", "g", "--max-deliveries", "-2"}, wantErr: "--max-deliveries must not be negative"},
		{name: "group list without stream", args: []string{"stream", "group", "list"}, wantErr: "accepts 1 arg(s), received 0"},
		{name: "group pending without group", args: []string{"stream", "group", "pending", "events"}, wantErr: "accepts 2 arg(s), received 1"},
		{name: "group pending negative limit", args: []string{"stream", "group", "pending", "events", "g", "--limit", "-1"}, wantErr: "--limit must not be negative"},
		{name: "group delete without group", args: []string{"stream", "group", "delete", "events"}, wantErr: "accepts 2 arg(s), received 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLIWithInput(t, tt.stdin, append(tt.args, "--addr", unreachable)...)
			require.Equal(t, 1, code)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.wantErr)
			require.Regexp(t, `^flo: `, stderr)
		})
	}
}

func TestCommandGroupsAloneShowTheirHelp(t *testing.T) {
	for _, args := range [][]string{{"stream"}, {"stream", "group"}, {"action"}, {"task", "dlq"}} {
		code, stdout, stderr := runCLI(t, args...)
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "Available Commands:", args)
	}
}

func TestStreamCommands(t *testing.T) {
	r := &recordingStreams{}
	addr := serveStreams(t, r)
	cli := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := runCLI(t, append([]string{"--addr", addr, "-n", "myapp"}, args...)...)
		require.Equal(t, 0, code, stderr)
		return stdout
	}
	last := func() proto.Message {
		sent := r.sent()
		return sent[len(sent)-1]
	}

	out := cli("stream", "create", "events", "--partitions", "4", "--retention", "24h", "--retention-bytes", "1048576")
	requireSent(t, &flov1.CreateStreamRequest{Namespace: "myapp", Name: "events", Partitions: 4, RetentionMs: 86_400_000, RetentionBytes: 1 << 20}, last())
	require.JSONEq(t, `{"namespace":"myapp","name":"events","partitions":4,"retention":"24h0m0s","retention_bytes":1048576}`, out)

	out = cli("stream", "info", "events")
	var info map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &info), out)
	require.InDelta(t, 3, info["length"], 0)
	require.Equal(t, "1767323045000-0", info["first_id"])
	require.Equal(t, "processors", info["groups"].([]any)[0].(map[string]any)["name"])

	out = cli("stream", "list")
	requireSent(t, &flov1.ListStreamsRequest{Namespace: "myapp", Limit: 1000}, last())
	require.JSONEq(t, `[{"namespace":"myapp","name":"events","partitions":2,"retention":"0s","retention_bytes":0}]`, out)

	out = cli("stream", "delete", "events")
	requireSent(t, &flov1.GetStreamRequest{Namespace: "myapp", Stream: "events"}, last())
	require.JSONEq(t, `{"stream":"events","status":"deleted"}`, out)

	out = cli("stream", "group", "create", "events", "audit", "--start", "$", "--max-deliveries", "8", "--mode", "key_shared")
	requireSent(t, &flov1.CreateGroupRequest{Namespace: "myapp", Stream: "events", Name: "audit", Start: "$", MaxDeliveries: 8, Mode: "key_shared"}, last())
	require.JSONEq(t, `{"namespace":"myapp","stream":"events","name":"audit","max_deliveries":8,"mode":"key_shared","lag":0,"pending":0}`, out)
	cli("stream", "group", "create", "events", "processors")
	requireSent(t, &flov1.CreateGroupRequest{Namespace: "myapp", Stream: "events", Name: "processors", Start: "-"}, last())

	out = cli("stream", "group", "list", "events")
	requireSent(t, &flov1.ListGroupsRequest{Namespace: "myapp", Stream: "events", Limit: 1000}, last())
	require.JSONEq(t, `[{"namespace":"myapp","stream":"events","name":"processors","max_deliveries":5,"mode":"shared","lag":4,"pending":0}]`, out)

	out = cli("stream", "group", "pending", "events", "processors", "--consumer", "w-1", "--limit", "50")
	requireSent(t, &flov1.ListPendingRequest{Namespace: "myapp", Stream: "events", Group: "processors", Consumer: "w-1", Limit: 50}, last())
	require.JSONEq(t, `{"total":12,"entries":[{"id":"1767323045000-0","consumer":"w-1","delivery_count":2,"delivered_at":"2026-01-02T03:04:05Z"}]}`, out)

	out = cli("stream", "group", "delete", "events", "audit")
	requireSent(t, &flov1.GetGroupRequest{Namespace: "myapp", Stream: "events", Group: "audit"}, last())
	require.JSONEq(t, `{"stream":"events","group":"audit","status":"deleted"}`, out)

	code, stdout, stderr := runCLI(t, "--addr", addr, "-n", "myapp", "stream", "info", "ghost")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "flo: get stream ghost:")
	require.Contains(t, stderr, "NotFound")
	require.Contains(t, stderr, `stream "ghost" not found in namespace "myapp"`)
}

func TestStreamAppend(t *testing.T) {
	r := &recordingStreams{}
	addr := serveStreams(t, r)
	base := []string{"--addr", addr, "-n", "myapp", "stream", "append", "events"}

	code, stdout, stderr := runCLI(t, append(base, `{"type": "signup"}`, "--key", "user-1", "--header", "source=web", "--header", "trace=a=b")...)
	require.Equal(t, 0, code, stderr)
	require.JSONEq(t, `{"id":"1767323045000-100000"}`, stdout)
	requireSent(t, &flov1.AppendRequest{Namespace: "myapp", Stream: "events", Records: []*flov1.AppendRecord{{
		Payload: []byte(`{"type": "signup"}`), Key: "user-1", Headers: map[string]string{"source": "web", "trace": "a=b"},
	}}}, r.sent()[0])

	// JSON lines on standard input: blank lines skipped, every record checked, one call.
	code, stdout, stderr = runCLIWithInput(t, "{\"n\":1}\n\n  [1,2]  \n\"text\"\n", append(base, "-", "--key", "k")...)
	require.Equal(t, 0, code, stderr)
	var got struct{ IDs []string }
	require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	require.Len(t, got.IDs, 3)
	requireSent(t, &flov1.AppendRequest{Namespace: "myapp", Stream: "events", Records: []*flov1.AppendRecord{
		{Payload: []byte(`{"n":1}`), Key: "k"}, {Payload: []byte(`[1,2]`), Key: "k"}, {Payload: []byte(`"text"`), Key: "k"},
	}}, r.sent()[1])

	// A file of 2,500 lines goes in batches of at most 1000, ids in line order.
	var lines strings.Builder
	for i := range 2500 {
		fmt.Fprintf(&lines, "{\"i\":%d}\n", i)
	}
	file := filepath.Join(t.TempDir(), "records.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(lines.String()), 0o600))
	code, stdout, stderr = runCLI(t, append(base, "--file", file)...)
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	require.Len(t, got.IDs, 2500)
	sent := r.sent()[2:]
	require.Len(t, sent, 3)
	i := 0
	for n, want := range []int{1000, 1000, 500} {
		req := sent[n].(*flov1.AppendRequest)
		require.Len(t, req.GetRecords(), want)
		for _, rec := range req.GetRecords() {
			require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), string(rec.GetPayload()))
			i++
		}
	}
}

func TestStreamRead(t *testing.T) {
	r := &recordingStreams{reads: []*flov1.ReadResponse{{
		Records: []*flov1.StreamRecord{
			{Id: "1767323045000-0", Payload: []byte(`{"type":"signup"}`), Headers: map[string]string{"source": "web"}, Key: "user-1", AppendedAt: appendedAt},
			{Id: "1767323045001-1001", Payload: []byte("binary\x00"), Partition: 1, AppendedAt: appendedAt},
		},
		Next: "@9.1.1",
	}}}
	addr := serveStreams(t, r)
	code, stdout, stderr := runCLI(t, "--addr", addr, "-n", "myapp", "stream", "read", "events", "--start", "-", "--end", "+", "--count", "2")
	require.Equal(t, 0, code, stderr)
	requireSent(t, &flov1.ReadRequest{Namespace: "myapp", Stream: "events", Start: "-", End: "+", Count: 2}, r.sent()[0])
	require.JSONEq(t, `{
		"records": [
			{"id":"1767323045000-0","payload":{"type":"signup"},"headers":{"source":"web"},"key":"user-1","partition":0,
				"appended_at":"2026-01-02T03:04:05Z"},
			{"id":"1767323045001-1001","payload":"YmluYXJ5AA==","partition":1,"appended_at":"2026-01-02T03:04:05Z"}
		],
		"next": "@9.1.1"
	}`, stdout)

	r.mu.Lock()
	r.reads = []*flov1.ReadResponse{{}}
	r.mu.Unlock()
	code, stdout, stderr = runCLI(t, "--addr", addr, "stream", "read", "events", "--tail", "10")
	require.Equal(t, 0, code, stderr)
	requireSent(t, &flov1.ReadRequest{Namespace: "default", Stream: "events", Tail: 10}, r.sent()[1])
	require.JSONEq(t, `{"records":[]}`, stdout)
}

func TestStreamReadFollow(t *testing.T) {
	rec := func(id string) *flov1.StreamRecord {
		return &flov1.StreamRecord{Id: id, Payload: []byte(`{"id":"` + id + `"}`)}
	}
	r := &recordingStreams{
		reads: []*flov1.ReadResponse{
			// The last two records, then reads on from each next: the first times out empty,
			// the second brings two records, the third one more.
			{Records: []*flov1.StreamRecord{rec("1-0"), rec("2-0")}, Next: "@9.2"},
			{Next: "@9.2"},
			{Records: []*flov1.StreamRecord{rec("3-0"), rec("4-0")}, Next: "@9.4"},
			{Records: []*flov1.StreamRecord{rec("5-0")}, Next: "@9.5"},
		},
		readDone: make(chan struct{}),
	}
	addr := serveStreams(t, r)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-r.readDone
		cancel() // ctrl-C while the next read waits
	}()
	var out, errOut strings.Builder
	code := run(ctx, []string{"--addr", addr, "stream", "read", "events", "--follow", "--tail", "2", "--block", "5s"}, strings.NewReader(""), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())

	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var got struct{ ID string }
		require.NoError(t, json.Unmarshal([]byte(line), &got), "one JSON object per line: %q", line)
		ids = append(ids, got.ID)
	}
	require.Equal(t, []string{"1-0", "2-0", "3-0", "4-0", "5-0"}, ids)

	var starts []string
	var blocks []int64
	for _, m := range r.sent() {
		starts = append(starts, m.(*flov1.ReadRequest).GetStart())
		blocks = append(blocks, m.(*flov1.ReadRequest).GetBlockMs())
	}
	require.Equal(t, []string{"", "@9.2", "@9.2", "@9.4", "@9.5"}, starts, "each read goes on from the last one's next")
	require.Equal(t, []int64{5000, 5000, 5000, 5000, 5000}, blocks)
	require.Equal(t, int32(2), r.sent()[0].(*flov1.ReadRequest).GetTail())
	require.Zero(t, r.sent()[1].(*flov1.ReadRequest).GetTail())
}

func TestStreamReadFollowNeedsNext(t *testing.T) {
	r := &recordingStreams{reads: []*flov1.ReadResponse{{Records: []*flov1.StreamRecord{{Id: "1-0", Payload: []byte(`{}`)}}}}}
	addr := serveStreams(t, r)
	code, stdout, stderr := runCLI(t, "--addr", addr, "stream", "read", "events", "--follow")
	require.Equal(t, 1, code)
	require.Contains(t, stdout, `"id":"1-0"`, "the records read are printed first")
	require.Contains(t, stderr, "flo: read stream events: the server named no position to read on from")
}
