// Package localpg runs a private Postgres server from the local installation
// (/usr/lib/postgresql/*/bin) so that `flo dev` and the test harness need no
// database set up by hand. It is a development tool, not a way to run Postgres
// in production.
package localpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// superuser is the role initdb creates; every URL uses it with trust auth,
// which is safe because the server only listens on loopback and a socket
// inside its private data directory.
const superuser = "postgres"

// maxSocketPath is the longest unix socket path Linux accepts (sun_path is
// 108 bytes including the terminating NUL).
const maxSocketPath = 107

// stopTimeout bounds a fast shutdown before the server is killed.
const stopTimeout = 30 * time.Second

// Options tune the server.
type Options struct {
	// Fsync makes the server flush to disk. Tests turn it off: losing the
	// data of a crashed test run costs nothing and skipping flushes makes
	// them much faster.
	Fsync bool
	// Log receives the output of initdb and postgres; nil discards it. The
	// last lines are kept either way and returned in startup errors.
	Log io.Writer
}

// Server is a running private Postgres.
type Server struct {
	dataDir string
	binDir  string
	opts    Options
	cred    *syscall.Credential
	tail    *tailBuffer

	// socketOnly is a server started with port 0: it listens on no TCP
	// port, only on its unix socket in the data directory.
	socketOnly bool

	mu   sync.Mutex
	port int
	proc *process
}

// process is one run of the postgres binary.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // exit status, valid once done is closed
}

// Start initialises dataDir if it holds no cluster yet (initdb) and starts
// postgres on 127.0.0.1:port with its unix socket in dataDir. With port 0 it
// listens on the unix socket only: a private socket cannot be taken by
// another process, as a TCP port picked beforehand could be before postgres
// binds it (postgres cannot bind port 0 and report what it got). dataDir
// must then be short enough for a socket path (about 90 bytes). When running as root, initdb and postgres run as
// the `postgres` user (or `nobody`), and the directories Start creates are
// chowned to that user; every existing parent of dataDir must be searchable by
// it. A server left running on dataDir by a crashed earlier process is shut
// down first. Start returns once the server accepts connections.
func Start(ctx context.Context, dataDir string, port int, opts Options) (*Server, error) {
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("resolve data dir %q: %w", dataDir, err)
	}
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{dataDir: dir, binDir: binDir, opts: opts, tail: &tailBuffer{max: 8 << 10}}
	if os.Geteuid() == 0 {
		s.cred, err = unprivilegedCredential()
		if err != nil {
			return nil, err
		}
	}
	if err := s.prepareDataDir(); err != nil {
		return nil, err
	}
	if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	if err := s.clearStaleServer(); err != nil {
		return nil, err
	}
	s.port, s.socketOnly = port, port == 0
	if s.socketOnly {
		// The port only names the socket file, .s.PGSQL.<port>.
		s.port = socketPort
		if len(dir)+len("/.s.PGSQL.5432") > maxSocketPath {
			return nil, fmt.Errorf("start postgres: data dir %s is too long for a unix socket; give a TCP port", dir)
		}
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// socketPort names the socket of a server listening on its unix socket only.
const socketPort = 5432

// URL returns the connection URL of database db.
func (s *Server) URL(db string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.urlLocked(db)
}

// Port returns the TCP port the server listens on, 0 when it listens on its
// unix socket only.
func (s *Server) Port() int {
	if s.socketOnly {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// DataDir returns the absolute data directory.
func (s *Server) DataDir() string { return s.dataDir }

// CreateDatabase creates database name unless it exists already.
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("create database %s: connect: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		// Created concurrently by someone else: the goal is reached.
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// Stop shuts the server down (fast shutdown: open sessions are rolled back)
// and waits for it to exit. Stopping a stopped server does nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

// Restart stops the server and starts it again on the same port and data
// directory, returning once it accepts connections.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.start(ctx)
}

func (s *Server) stopLocked() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop postgres: %w", err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill postgres: %w", err)
	}
	<-p.done
	return fmt.Errorf("stop postgres: no fast shutdown within %s, killed", stopTimeout)
}

var errExited = errors.New("postgres exited during startup")

// start launches postgres and waits until it accepts connections.
func (s *Server) start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("start postgres: already running")
	}
	listen := "127.0.0.1"
	if s.socketOnly {
		listen = ""
	}
	args := []string{
		"-D", s.dataDir,
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=" + listen,
		"-c", "max_connections=200",
		// mmap keeps dynamic shared memory in the data directory, so a small
		// /dev/shm (common in containers) cannot break parallel queries.
		"-c", "dynamic_shared_memory_type=mmap",
	}
	if s.socketOnly || len(s.dataDir)+len("/.s.PGSQL.65535") <= maxSocketPath {
		args = append(args, "-k", s.dataDir)
	} else {
		args = append(args, "-c", "unix_socket_directories=")
	}
	if !s.opts.Fsync {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	cmd := s.command(filepath.Join(s.binDir, "postgres"), args...)
	p, err := launch(cmd)
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.proc = p
	if err := s.waitReady(ctx, p); err != nil {
		_ = s.stopLocked()
		return fmt.Errorf("start postgres on port %d: %w\n%s", s.port, err, s.tail.String())
	}
	return nil
}

// launch starts cmd from a goroutine locked to its OS thread and keeps that
// thread until the process exits: Pdeathsig fires when the creating thread
// dies, so the thread must outlive the process for the signal to mean "our
// process died" and nothing else.
func launch(cmd *exec.Cmd) (*process, error) {
	p := &process{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

func (s *Server) waitReady(ctx context.Context, p *process) error {
	url := s.urlLocked("postgres")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(attemptCtx, url)
		if err == nil {
			err = conn.Ping(attemptCtx)
			_ = conn.Close(attemptCtx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%w: %v", errExited, p.err)
		case <-ctx.Done():
			return fmt.Errorf("wait for postgres: %w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func (s *Server) urlLocked(db string) string {
	if !s.socketOnly {
		return URLAt(s.port, db)
	}
	q := url.Values{"host": {s.dataDir}, "port": {strconv.Itoa(s.port)}, "sslmode": {"disable"}}
	u := url.URL{Scheme: "postgres", User: url.User(superuser), Path: "/" + db, RawQuery: q.Encode()}
	return u.String()
}

// URLAt is the connection URL of database db of a server of this package
// listening on port, for a process that did not start it (the CLI reading
// the tables of `flo dev`'s Postgres).
func URLAt(port int, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// command builds an exec.Cmd for a Postgres binary with a clean environment
// (no PG* variables leaking in) and the unprivileged credential when needed.
func (s *Server) command(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	env := []string{"LC_ALL=C", "LANG=C"}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "TZ=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.Dir = s.dataDir
	out := io.Writer(s.tail)
	if s.opts.Log != nil {
		out = io.MultiWriter(s.opts.Log, s.tail)
	}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: s.cred,
		// Own process group: a ctrl-C in the terminal reaches us, and we
		// stop Postgres after the services using it, not at the same time.
		Setpgid:   true,
		Pdeathsig: syscall.SIGINT,
	}
	return cmd
}

func (s *Server) initdb(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(s.dataDir, "PG_VERSION")); err == nil {
		return s.chownTree()
	}
	args := []string{"-D", s.dataDir, "-U", superuser, "--auth=trust", "-E", "UTF8", "--locale=C"}
	if !s.opts.Fsync {
		args = append(args, "--no-sync")
	}
	cmd := s.command(filepath.Join(s.binDir, "initdb"), args...)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	p, err := launch(cmd)
	if err != nil {
		return fmt.Errorf("initdb %s: %w", s.dataDir, err)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("initdb %s: %w", s.dataDir, ctx.Err())
	}
	if p.err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", s.dataDir, p.err, s.tail.String())
	}
	return nil
}

// prepareDataDir creates dataDir and its missing parents, hands the ones it
// created to the unprivileged user and checks that user can reach dataDir.
func (s *Server) prepareDataDir() error {
	var created []string
	for dir := s.dataDir; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(dir); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("prepare data dir: %w", err)
		}
		created = append(created, dir)
		if dir == filepath.Dir(dir) {
			break
		}
	}
	if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
		return fmt.Errorf("prepare data dir: %w", err)
	}
	if s.cred == nil {
		return nil
	}
	for _, dir := range created {
		if dir != s.dataDir {
			// Parents created here hold nothing else; others must be able
			// to enter them so that the server user reaches the data dir.
			if err := os.Chmod(dir, 0o755); err != nil {
				return fmt.Errorf("prepare data dir: %w", err)
			}
		}
		if err := os.Lchown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("prepare data dir: %w", err)
		}
	}
	if err := os.Lchown(s.dataDir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
		return fmt.Errorf("prepare data dir: %w", err)
	}
	for dir := filepath.Dir(s.dataDir); ; dir = filepath.Dir(dir) {
		if err := s.checkSearchable(dir); err != nil {
			return err
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

// checkSearchable reports a clear error when the server user could not
// traverse dir, instead of letting initdb fail with "permission denied".
func (s *Server) checkSearchable(dir string) error {
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("prepare data dir: %w", err)
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	mode := info.Mode().Perm()
	switch {
	case st.Uid == s.cred.Uid:
		ok = mode&0o100 != 0
	case st.Gid == s.cred.Gid:
		ok = mode&0o010 != 0
	default:
		ok = mode&0o001 != 0
	}
	if !ok {
		return fmt.Errorf("prepare data dir %s: user %d cannot enter %s (mode %v); choose a data dir the postgres user can reach", s.dataDir, s.cred.Uid, dir, mode)
	}
	return nil
}

// chownTree gives an existing cluster to the server user, for example one
// created by an earlier run as a different user.
func (s *Server) chownTree() error {
	if s.cred == nil {
		return nil
	}
	uid, gid := int(s.cred.Uid), int(s.cred.Gid)
	err := filepath.WalkDir(s.dataDir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid && int(st.Gid) == gid {
			return nil
		}
		return os.Lchown(path, uid, gid)
	})
	if err != nil {
		return fmt.Errorf("chown data dir %s: %w", s.dataDir, err)
	}
	return nil
}

// clearStaleServer deals with postmaster.pid left behind by an earlier run:
// a postgres still serving this data dir (its parent crashed) is shut down,
// and a pid file whose process is gone is removed, so that a reused pid
// cannot make postgres believe the directory is still in use.
func (s *Server) clearStaleServer() error {
	pidFile := filepath.Join(s.dataDir, "postmaster.pid")
	data, err := os.ReadFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", pidFile, err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err == nil && pid > 0 && s.isOurPostgres(pid) {
		if err := stopStale(pid); err != nil {
			return err
		}
	}
	if err := os.Remove(pidFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", pidFile, err)
	}
	locks, _ := filepath.Glob(filepath.Join(s.dataDir, ".s.PGSQL.*.lock"))
	for _, l := range locks {
		_ = os.Remove(l)
	}
	return nil
}

// isOurPostgres reports whether pid is a postgres postmaster serving our data
// directory, judged from its command line.
func (s *Server) isOurPostgres(pid int) bool {
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) == 0 || !strings.HasSuffix(args[0], "postgres") {
		return false
	}
	i := slices.Index(args, "-D")
	return i >= 0 && i+1 < len(args) && filepath.Clean(args[i+1]) == s.dataDir
}

func stopStale(pid int) error {
	proc, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	_ = proc.Signal(syscall.SIGINT)
	deadline := time.Now().Add(stopTimeout)
	for time.Now().Before(deadline) {
		if err := proc.Signal(syscall.Signal(0)); err != nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = proc.Signal(syscall.SIGKILL)
	for range 100 {
		if err := proc.Signal(syscall.Signal(0)); err != nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("stale postgres %d does not exit", pid)
}

// findBinDir picks the newest installed major version.
func findBinDir() (string, error) {
	dirs, err := filepath.Glob("/usr/lib/postgresql/*/bin")
	if err != nil {
		return "", fmt.Errorf("find postgres: %w", err)
	}
	best, bestVersion := "", -1.0
	for _, d := range dirs {
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "postgres")); err != nil {
			continue
		}
		if v > bestVersion {
			best, bestVersion = d, v
		}
	}
	if best == "" {
		return "", errors.New("find postgres: no /usr/lib/postgresql/*/bin/postgres installed")
	}
	return best, nil
}

// unprivilegedCredential returns the user to run Postgres as when we are
// root, because initdb and postgres refuse to run as root.
func unprivilegedCredential() (*syscall.Credential, error) {
	var lastErr error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			lastErr = err
			continue
		}
		uid, err := strconv.ParseUint(u.Uid, 10, 32)
		if err != nil {
			lastErr = err
			continue
		}
		gid, err := strconv.ParseUint(u.Gid, 10, 32)
		if err != nil {
			lastErr = err
			continue
		}
		// Groups stays empty so root's supplementary groups are dropped.
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("find an unprivileged user to run postgres: %w", lastErr)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(bytes.TrimSpace(b.buf))
}
