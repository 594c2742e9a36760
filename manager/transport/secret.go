package transport

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Keys of a TLS Secret, as cert-manager writes them.
const (
	KeyCert = corev1.TLSCertKey       // "tls.crt"
	KeyKey  = corev1.TLSPrivateKeyKey // "tls.key"
	KeyCA   = "ca.crt"
)

// GeneratedValidity is how long certificates the manager generates are valid.
const GeneratedValidity = 3 * 365 * 24 * time.Hour

// Generate makes a self-signed CA and a serving certificate for names (DNS names, and IP
// addresses as IP SANs) signed by it (ECDSA P-256), valid from now for validity, and returns
// them and the serving key as PEM. The CA's key is discarded: it signs nothing else.
func Generate(names []string, now time.Time, validity time.Duration) (caPEM, certPEM, keyPEM []byte, err error) {
	if len(names) == 0 {
		return nil, nil, nil, errors.New("transport: a serving certificate needs at least one DNS name")
	}
	var dnsNames []string
	var ips []net.IP
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			ips = append(ips, ip)
		} else {
			dnsNames = append(dnsNames, n)
		}
	}
	serial := func() *big.Int {
		n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
		return n
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	ca := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "fusebox manager CA"},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(validity), IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("making the CA certificate: %w", err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	leaf := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: names[0]}, DNSNames: dnsNames, IPAddresses: ips,
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(validity), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("making the serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// SecretOptions configure EnsureSecret.
type SecretOptions struct {
	Client    kubernetes.Interface
	Namespace string
	// Name is the TLS Secret (tls.crt, tls.key, and ca.crt for agents).
	Name string
	// Create makes the Secret when it is absent: a self-signed CA and a serving certificate
	// for DNSNames (the Service's names, and those agents outside the cluster use: DNS names
	// or IP addresses). A Secret made so for other names (its generatedForAnnotation) is made
	// again for these. Without Create, a missing Secret is an error (one that cert-manager or
	// the operator provides).
	Create   bool
	DNSNames []string
	// CAConfigMap, if set, is the ConfigMap in Namespace where the Secret's ca.crt is
	// published for agents (key ca.crt), kept up to date as the Secret changes.
	CAConfigMap string
	// Owner, if set, owns the Secret and the CA ConfigMap this manager creates (the manager's
	// Deployment): the garbage collector deletes them with it, also where no namespace
	// deletion would. A Secret or ConfigMap that exists already is left as it is.
	Owner  *metav1.OwnerReference
	Logger *slog.Logger
}

// owned is o.Owner as an object's owner references.
func (o SecretOptions) owned() []metav1.OwnerReference {
	if o.Owner == nil {
		return nil
	}
	return []metav1.OwnerReference{*o.Owner}
}

// Secret is a Source serving the certificate of a Kubernetes TLS Secret, watched (one object,
// through an informer) and reloaded when it changes.
type Secret struct {
	o SecretOptions

	mu  sync.Mutex // guards cur
	cur *tls.Certificate
}

// EnsureSecret makes the Secret if it is absent and allowed to (several replicas may race:
// the first one's Secret wins, the others load it), starts watching it until ctx ends,
// publishes its CA, and returns once a certificate is loaded.
func EnsureSecret(ctx context.Context, o SecretOptions) (*Secret, error) {
	if o.Client == nil || o.Namespace == "" || o.Name == "" {
		return nil, errors.New("transport: a client, a namespace and a Secret name are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	secrets := o.Client.CoreV1().Secrets(o.Namespace)
	cur, err := secrets.Get(ctx, o.Name, metav1.GetOptions{})
	names := strings.Join(o.DNSNames, ",")
	switch {
	case apierrors.IsNotFound(err) && !o.Create:
		return nil, fmt.Errorf("TLS Secret %s/%s does not exist: provide it (tls.crt, tls.key, ca.crt; a cert-manager Certificate with secretName %s) or let the manager create one (--tls-secret-create)",
			o.Namespace, o.Name, o.Name)
	case apierrors.IsNotFound(err):
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace,
				Labels: map[string]string{"app.kubernetes.io/part-of": "fusebox"}, OwnerReferences: o.owned()},
			Type: corev1.SecretTypeTLS,
		}
		if err := generateInto(s, o.DNSNames); err != nil {
			return nil, err
		}
		if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating TLS Secret %s/%s: %w", o.Namespace, o.Name, err)
		} else if err == nil {
			o.Logger.Info("created the manager's TLS Secret with a self-signed CA", "secret", o.Namespace+"/"+o.Name, "dns_names", o.DNSNames)
		}
	case err != nil:
		return nil, fmt.Errorf("reading TLS Secret %s/%s: %w", o.Namespace, o.Name, err)
	case o.Create && cur.Annotations[generatedForAnnotation] != "" && cur.Annotations[generatedForAnnotation] != names:
		// Made by a manager for other names (a stack that added or changed its external names):
		// made again, with a new CA that the CA ConfigMap publishes. A concurrent replica's
		// update wins (Conflict), and this one loads that.
		s := cur.DeepCopy()
		if err := generateInto(s, o.DNSNames); err != nil {
			return nil, err
		}
		if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("updating TLS Secret %s/%s for %s: %w", o.Namespace, o.Name, names, err)
		} else if err == nil {
			o.Logger.Info("made the manager's TLS Secret again for new names", "secret", o.Namespace+"/"+o.Name,
				"dns_names", o.DNSNames, "was", cur.Annotations[generatedForAnnotation])
		}
	}
	src := &Secret{o: o}
	f := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithNamespace(o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", o.Name).String()
		}))
	inf := f.Core().V1().Secrets().Informer()
	loaded := make(chan error, 1)
	on := func(obj any) {
		s, ok := obj.(*corev1.Secret)
		if !ok || s.Name != o.Name {
			return
		}
		err := src.load(ctx, s)
		if err != nil {
			o.Logger.Error("keeping the previous serving certificate", "secret", o.Namespace+"/"+o.Name, "err", err)
		}
		select {
		case loaded <- err:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, n any) { on(n) }}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("watching TLS Secret %s/%s: %w", o.Namespace, o.Name, ctx.Err())
	}
	select {
	case err := <-loaded:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return src, nil
}

// generatedForAnnotation records, on a Secret the manager made, the names it was made for.
const generatedForAnnotation = "fusebox.dev/generated-for"

// generateInto gives s a new CA, serving certificate and key for names, and records them.
func generateInto(s *corev1.Secret, names []string) error {
	caPEM, certPEM, keyPEM, err := Generate(names, time.Now(), GeneratedValidity)
	if err != nil {
		return err
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[generatedForAnnotation] = strings.Join(names, ",")
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[KeyCert], s.Data[KeyKey], s.Data[KeyCA] = certPEM, keyPEM, caPEM
	return nil
}

// load takes the certificate of s and publishes its CA.
func (src *Secret) load(ctx context.Context, s *corev1.Secret) error {
	name := src.o.Namespace + "/" + src.o.Name
	c, err := tls.X509KeyPair(s.Data[KeyCert], s.Data[KeyKey])
	if err != nil {
		return fmt.Errorf("TLS Secret %s: keys %s and %s: %w", name, KeyCert, KeyKey, err)
	}
	src.mu.Lock()
	changed := src.cur != nil
	src.cur = &c
	src.mu.Unlock()
	if changed {
		src.o.Logger.Info("serving certificate reloaded", "secret", name)
	}
	if src.o.CAConfigMap == "" {
		return nil
	}
	ca := s.Data[KeyCA]
	if len(ca) == 0 {
		return fmt.Errorf("TLS Secret %s has no %s for agents to trust: add it (cert-manager writes it for CA issuers)", name, KeyCA)
	}
	return src.publishCA(ctx, ca)
}

// publishCA writes ca into the CA ConfigMap unless it holds it already.
func (src *Secret) publishCA(ctx context.Context, ca []byte) error {
	cms := src.o.Client.CoreV1().ConfigMaps(src.o.Namespace)
	cm, err := cms.Get(ctx, src.o.CAConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: src.o.CAConfigMap, Namespace: src.o.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "fusebox"}, OwnerReferences: src.o.owned()},
			Data: map[string]string{KeyCA: string(ca)}}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("publishing the CA in ConfigMap %s/%s: %w", src.o.Namespace, src.o.CAConfigMap, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s/%s: %w", src.o.Namespace, src.o.CAConfigMap, err)
	}
	if bytes.Equal([]byte(cm.Data[KeyCA]), ca) {
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[KeyCA] = string(ca)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		// A conflict: another replica published it meanwhile.
		return fmt.Errorf("publishing the CA in ConfigMap %s/%s: %w", src.o.Namespace, src.o.CAConfigMap, err)
	}
	return nil
}

// GetCertificate implements Source.
func (src *Secret) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	src.mu.Lock()
	defer src.mu.Unlock()
	return src.cur, nil
}
