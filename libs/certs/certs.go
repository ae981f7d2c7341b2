// Package certs builds Flo's TLS configurations: for the public edge, a
// server configuration whose certificate is re-read when its files change, so
// a rotated certificate (a renewed Kubernetes Secret, say) is served without a
// restart, and a client configuration trusting one CA file; inside the
// cluster, both sides of mutual TLS against a cluster CA, each presenting a
// key pair re-read the same way.
package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// checkInterval is how often, at most, the files are looked at again: a
// handshake costs two stat calls at most once a second.
const checkInterval = time.Second

// Server returns a server TLS configuration serving the key pair in certFile
// and keyFile. When either file's modification time or size changes, the next
// handshake after at most a second serves the new pair; a new pair that does
// not load (half written, or a key that does not match) is logged and the old
// one is served until the files change again.
func Server(certFile, keyFile string, log *slog.Logger) (*tls.Config, error) {
	r, err := newReloader(certFile, keyFile, checkInterval, log)
	if err != nil {
		return nil, err
	}
	return &tls.Config{GetCertificate: r.certificate, MinVersion: tls.VersionTLS12}, nil
}

// Client returns a client TLS configuration that trusts only the CA
// certificates in caFile.
func Client(caFile string) (*tls.Config, error) {
	pool, err := caPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// MutualServer returns a server TLS 1.3 configuration that serves the key
// pair in certFile and keyFile, re-read like Server's, and requires every
// client to present a certificate signed by a CA in caFile.
func MutualServer(certFile, keyFile, caFile string, log *slog.Logger) (*tls.Config, error) {
	pool, r, err := mutual(certFile, keyFile, caFile, log)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		GetCertificate: r.certificate,
		ClientCAs:      pool,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		MinVersion:     tls.VersionTLS13,
	}, nil
}

// MutualClient returns a client TLS 1.3 configuration that trusts only the
// CAs in caFile and presents the key pair in certFile and keyFile, re-read
// like Server's.
func MutualClient(certFile, keyFile, caFile string, log *slog.Logger) (*tls.Config, error) {
	pool, r, err := mutual(certFile, keyFile, caFile, log)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return r.current(), nil },
		RootCAs:              pool,
		MinVersion:           tls.VersionTLS13,
	}, nil
}

// mutual reads what either side of mutual TLS needs: the CAs and its own
// key pair.
func mutual(certFile, keyFile, caFile string, log *slog.Logger) (*x509.CertPool, *reloader, error) {
	pool, err := caPool(caFile)
	if err != nil {
		return nil, nil, err
	}
	r, err := newReloader(certFile, keyFile, checkInterval, log)
	if err != nil {
		return nil, nil, err
	}
	return pool, r, nil
}

// caPool reads the CA certificates in caFile. The CAs are read once: a new
// CA is rolled out with a bundle holding the old and the new one.
func caPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
	}
	return pool, nil
}

// reloader holds the key pair served and what its files looked like when it
// was loaded.
type reloader struct {
	certFile, keyFile string
	interval          time.Duration
	log               *slog.Logger

	mu      sync.Mutex
	pair    *tls.Certificate
	stamps  [2]stamp
	checked time.Time
}

// stamp is what tells a changed file: its modification time and size, and
// its identity, since a file renamed over it may carry the same time (the
// kernel's clock ticks in milliseconds) and size.
type stamp struct {
	info os.FileInfo
}

func (s stamp) same(o stamp) bool {
	return s.info.ModTime().Equal(o.info.ModTime()) && s.info.Size() == o.info.Size() && os.SameFile(s.info, o.info)
}

func newReloader(certFile, keyFile string, interval time.Duration, log *slog.Logger) (*reloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("TLS certificate and key files must both be set")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &reloader{certFile: certFile, keyFile: keyFile, interval: interval, log: log}
	stamps, err := r.stat()
	if err != nil {
		return nil, err
	}
	if err := r.load(stamps); err != nil {
		return nil, err
	}
	r.checked = time.Now()
	return r, nil
}

// certificate is the tls.Config's GetCertificate.
func (r *reloader) certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.current(), nil
}

// current is the pair to present now, loaded again first when the files
// changed and the interval since the last look has passed.
func (r *reloader) current() *tls.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= r.interval {
		r.checked = now
		r.reloadIfChanged()
	}
	return r.pair
}

// reloadIfChanged loads the pair again when a file changed; on failure it
// keeps the pair it has.
func (r *reloader) reloadIfChanged() {
	stamps, err := r.stat()
	if err != nil {
		r.log.Warn("TLS certificate files unreadable; serving the loaded certificate", slog.Any("error", err))
		return
	}
	if stamps[0].same(r.stamps[0]) && stamps[1].same(r.stamps[1]) {
		return
	}
	if err := r.load(stamps); err != nil {
		// Remember the failed files so each handshake does not retry them;
		// the next change to either file is tried again.
		r.stamps = stamps
		r.log.Error("TLS certificate changed but does not load; serving the previous one", slog.Any("error", err))
		return
	}
	r.log.Info("TLS certificate reloaded", slog.String("cert_file", r.certFile))
}

func (r *reloader) load(stamps [2]stamp) error {
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load TLS key pair %s, %s: %w", r.certFile, r.keyFile, err)
	}
	r.pair, r.stamps = &pair, stamps
	return nil
}

func (r *reloader) stat() ([2]stamp, error) {
	var stamps [2]stamp
	for i, f := range []string{r.certFile, r.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return stamps, fmt.Errorf("stat TLS file: %w", err)
		}
		stamps[i] = stamp{info: fi}
	}
	return stamps, nil
}
