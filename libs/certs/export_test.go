package certs

import (
	"crypto/tls"
	"time"
)

// ServerEvery is Server looking at the files at most once per interval, for
// tests that must not wait a second.
func ServerEvery(certFile, keyFile string, interval time.Duration) (*tls.Config, error) {
	r, err := newReloader(certFile, keyFile, interval, nil)
	if err != nil {
		return nil, err
	}
	return &tls.Config{GetCertificate: r.certificate}, nil
}
