// Package kmsplugin is a KMS v2 plugin for tests: kube-apiserver reaches it
// over gRPC on a Unix socket, as it reaches a cloud provider's plugin, and
// it encrypts with AES-GCM under a key derived from the key ID it reports.
// SetKeyID rotates the key: kube-apiserver sees the new key ID at its next
// Status call (every minute while the plugin is healthy) and encrypts what
// it writes from then on under it, while every earlier key ID still
// decrypts. Its keys are derived from their IDs: never use it to protect
// anything.
package kmsplugin

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/kms/pkg/service"
)

// Plugin is a running KMS v2 plugin.
type Plugin struct {
	// Endpoint is what an EncryptionConfiguration names it by
	// ("unix:///...").
	Endpoint string

	server *service.GRPCService
	done   chan error

	mu    sync.Mutex
	keyID string
}

// Start serves a plugin reporting keyID on a Unix socket in a new
// directory under os.TempDir (a socket path has at most 107 bytes); Stop
// ends it.
func Start(keyID string) (*Plugin, error) {
	dir, err := os.MkdirTemp("", "kms")
	if err != nil {
		return nil, err
	}
	socket := filepath.Join(dir, "kms.sock")
	p := &Plugin{Endpoint: "unix://" + socket, keyID: keyID, done: make(chan error, 1)}
	p.server = service.NewGRPCService(socket, 10*time.Second, p)
	go func() { p.done <- p.server.ListenAndServe() }()
	// Serving once the socket exists.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(socket); err == nil {
			return p, nil
		}
		select {
		case err := <-p.done:
			return nil, fmt.Errorf("KMS plugin on %s: %w", socket, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("KMS plugin on %s: no socket after 10s", socket)
		}
	}
}

// Stop ends the plugin and removes its socket.
func (p *Plugin) Stop() {
	p.server.Close()
	if err := <-p.done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		// Closed, it stops serving; anything else is worth a look.
		fmt.Fprintf(os.Stderr, "kmsplugin: %v\n", err)
	}
	_ = os.RemoveAll(filepath.Dir(p.Endpoint[len("unix://"):]))
}

// SetKeyID makes keyID the key the plugin encrypts with and reports.
func (p *Plugin) SetKeyID(keyID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keyID = keyID
}

func (p *Plugin) current() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keyID
}

// Status reports the plugin healthy at its current key ID.
func (p *Plugin) Status(context.Context) (*service.StatusResponse, error) {
	return &service.StatusResponse{Version: "v2", Healthz: "ok", KeyID: p.current()}, nil
}

// Encrypt seals data under the current key ID.
func (p *Plugin) Encrypt(_ context.Context, _ string, data []byte) (*service.EncryptResponse, error) {
	keyID := p.current()
	aead, err := keyFor(keyID)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return &service.EncryptResponse{Ciphertext: aead.Seal(nonce, nonce, data, []byte(keyID)), KeyID: keyID}, nil
}

// Decrypt opens a ciphertext sealed under any key ID.
func (p *Plugin) Decrypt(_ context.Context, _ string, req *service.DecryptRequest) ([]byte, error) {
	aead, err := keyFor(req.KeyID)
	if err != nil {
		return nil, err
	}
	if len(req.Ciphertext) < aead.NonceSize() {
		return nil, errors.New("ciphertext too short")
	}
	nonce, sealed := req.Ciphertext[:aead.NonceSize()], req.Ciphertext[aead.NonceSize():]
	return aead.Open(nil, nonce, sealed, []byte(req.KeyID))
}

// keyFor is the AES-256-GCM key of a key ID: its SHA-256.
func keyFor(keyID string) (cipher.AEAD, error) {
	if keyID == "" {
		return nil, errors.New("empty key ID")
	}
	sum := sha256.Sum256([]byte("restow kmsplugin " + keyID))
	block, err := aes.NewCipher(sum[:])
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
