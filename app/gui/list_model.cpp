// Rows, values and role names for the list models.
#include "list_model.h"

#include <QMetaEnum>

namespace granule::app {

ListModel::ListModel(int display_role, QObject* parent)
    : QAbstractListModel(parent), display_role_(display_role) {}

int ListModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : itemCount();
}

QVariant ListModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= itemCount()) return {};
  return value(index.row(), role == Qt::DisplayRole ? display_role_ : role);
}

QHash<int, QByteArray> ListModel::roleNames() const {
  // The subclass's Q_ENUM(Role): each key less its "Role" suffix, first letter lowered.
  const QMetaObject* meta = metaObject();
  const int at = meta->indexOfEnumerator("Role");
  Q_ASSERT_X(at >= 0, "ListModel::roleNames", "a list model declares Q_ENUM(Role)");
  const QMetaEnum roles = meta->enumerator(at);
  QHash<int, QByteArray> names;
  for (int i = 0; i < roles.keyCount(); ++i) {
    QByteArray name(roles.key(i));
    name.chop(int(sizeof("Role")) - 1);
    name[0] = static_cast<char>(QChar::toLower(static_cast<char32_t>(name[0])));
    names.insert(roles.value(i), name);
  }
  return names;
}

}  // namespace granule::app
