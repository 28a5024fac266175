// ListModel: what the window's list models share. The count QML binds to, rowCount, data()
// for valid rows only (Qt::DisplayRole answered as the model's display role), and role names
// made from the subclass's Role enum (Q_ENUM): ChatIdRole is "chatId", so no model writes a
// second table of its roles' names. Subclasses name it granule::app::ListModel in full: Qt
// 6.4's qmltyperegistrar looks a base class up by the name as written, and qmllint then sees
// the inherited count.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QAbstractListModel>

namespace granule::app {

class ListModel : public QAbstractListModel {
  Q_OBJECT
  QML_ANONYMOUS
  Q_PROPERTY(int count READ count NOTIFY countChanged)

 public:
  int count() const { return itemCount(); }
  int rowCount(const QModelIndex& parent = {}) const final;
  QVariant data(const QModelIndex& index, int role) const final;
  QHash<int, QByteArray> roleNames() const final;

 Q_SIGNALS:
  void countChanged();

 protected:
  // `display_role`: the role Qt::DisplayRole reads (a row's text in a view without roles).
  explicit ListModel(int display_role, QObject* parent = nullptr);

  virtual int itemCount() const = 0;
  // A role's value for a row in [0, itemCount()); an invalid QVariant for a role it lacks.
  virtual QVariant value(int row, int role) const = 0;

 private:
  int display_role_;
};

}  // namespace granule::app
